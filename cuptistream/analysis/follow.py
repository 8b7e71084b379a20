"""``cuptistream compare --follow``: the comparison over a Kafka topic while the job writes to it.

``follow_kafka`` reads every partition of the topic from its beginning and keeps polling past the
end, yielding each batch as a ``Part`` and ``None`` after each poll that brought nothing (an idle
tick). ``compare_live`` folds the batches as ``compare`` does and, on an idle tick, closes the
intervals that ended ``lateness`` before the Unix clock now (events carry Unix time through their
batch's clock reading), so a quiet topic still gets its intervals compared. It runs until SIGINT
(Ctrl-C), then compares the whole span.

The topic may carry raw records or the collector's statistics (msgpack batches or ``jsonl`` rows,
both decoded to full Structs): ``compare_read.gpu_work`` takes both, so following needs nothing of
its own for statistics. They reach the topic only once the collector closes their interval (about
3 s after its end, plus the sink's flush): ``lateness`` must stay above that delay.

``FollowWriter`` prints one line when a rank becomes an outlier in an interval, with the likely
cause, and one when it no longer is; the whole span's tables at the end.

Failure modes: an unreachable broker or a topic that does not exist is a ``UserError``; partitions
added while following are not read; batches that reach the topic more than ``lateness`` after their
interval closed count in the whole span only (``late_events``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from cuptistream.analysis.compare import Comparer, CompareResult, IntervalResult
from cuptistream.analysis.compare_read import gpu_work
from cuptistream.analysis.compare_report import TextWriter, _clock
from cuptistream.analysis.outliers import Rule, cause
from cuptistream.analysis.records import Part
from cuptistream.analysis.select import Selection


def follow_kafka(url: str, *, poll_ms: int = 500, timeout_s: float = 5.0) -> Iterator[Part | None]:
    """Every batch of the topic from its beginning, then as they come; ``None`` after an empty poll."""
    from cuptistream.recording.kafka_reader import message_batch, open_topic

    consumer, _ = open_topic(url, timeout_s)
    try:
        while True:
            records = consumer.poll(timeout_ms=poll_ms)
            if not records:
                yield None
                continue
            for messages in records.values():
                for message in messages:
                    _, batch = message_batch(message)
                    yield Part(batch.resource, batch.clock.offset_ns, batch.events)
    finally:
        consumer.close()


def compare_live(
    parts: Iterator[Part | None], on_interval: Callable[[IntervalResult], None], *,
    selection: Selection | None = None, now_ns: Callable[[], int] = time.time_ns, **options: Any,
) -> CompareResult:  # fmt: skip
    """Fold ``parts`` until they end or SIGINT; ``None`` closes what ended ``lateness`` before now."""
    sel = selection or Selection()
    comparer = Comparer(on_interval, devices=sel.devices, **options)
    last = -(2**62)
    try:
        for part in parts:
            if part is None:
                comparer.advance(now_ns())
                continue
            work = gpu_work(part, sel, last)
            if work is None:
                continue
            last = work.first
            comparer.advance(work.first)
            comparer.add_work(work)
    except KeyboardInterrupt:
        pass  # the whole span of what was read
    return comparer.finish()


class FollowWriter(TextWriter):
    """A line when a rank becomes an outlier (and when it stops being one); the tables at the end."""

    def __init__(self, out: TextIO, rule: Rule) -> None:
        super().__init__(out, rule)
        self.out.write("following; Ctrl-C ends and prints the whole span\n")
        self.out.flush()
        self.flagged: set[str] = set()

    def interval(self, result: IntervalResult) -> None:
        now: dict[str, list[Any]] = {}
        for f in result.flags:
            now.setdefault(f.rank, []).append(f)
        at = f"[{_clock(result.start_unix_ns)}-{_clock(result.end_unix_ns)} UTC]"
        for rank in sorted(set(now) - self.flagged):
            self.out.write(f"{at} {rank} became an outlier: {cause(now[rank])}\n")
        for rank in sorted(self.flagged - set(now)):
            self.out.write(f"{at} {rank} is no longer an outlier\n")
        self.flagged = set(now)
        self.out.flush()
