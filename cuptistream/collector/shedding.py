"""The collector's front door: under overload, whole activity buffers are dropped BEFORE decoding.

Decoding, packing and encoding are most of the collector's per-record cost. When the pipeline
cannot take more events, decoding a buffer only to drop its events at a full lane spends the CPU
that the buffers it can still deliver need: under 2x overload the collector would deliver less than
at 1x. So while nothing downstream has room, a connection counts the buffer's records (a walk over
the record headers, no gathers, no events) and releases the slot:

- the memory budget is full under ``drop_newest`` (the intake would refuse the events), or
- every running lane is saturated (``SinkLane.saturated``: full under a dropping policy, the
  intake's backlog counted, since all of it is bound for every lane).

Buffers decoded in the collector's own threads (no decode worker) are decoded one at a time
(``FrontDoor.decode_turn``), and the front door is asked when a buffer's turn comes. Under one GIL
concurrent decodes gained nothing: each held its buffer's events (~14 MiB for a GPU's 4 MiB buffer)
while the others ran, and together they starved the pipeline thread, so decoded events were dropped
at the lanes (with one turn, many replay probes on 2 cores deliver about twice as many events and
drop none after decoding; see docs/performance.md).

Buffers being decoded count too: from ``admit`` until the caller's ``decoded``, each is reserved
``RESERVE_PER_BYTE`` times its bytes on its way to the lanes. With decode workers several buffers
are decoded at once, and each would look at lanes that do not yet hold the others' events, so
events would be dropped at a full sink after decoding them instead of shed before. A buffer that
only those in flight would leave without room waits for them (its slot holds it meanwhile) and is
not shed: shedding it too cuts what a small collector delivers under many probes by about a third.
A buffer's own events are not counted against it, so an idle pipeline always admits one, whatever its size.

Nothing is shed under ``block`` (the connection waits instead, and so does the probe's hand-off) or
while some lane has room. Under ``block`` a buffer also waits, in its slot, while its events and those
being decoded would pass the memory budget (unless none is being decoded): each connection blocked
in the intake would hold its decoded buffer, and many probes would hold the collector at more than
twice its budget. The loss is ``Loss(stage="intake", reason="shed_before_decode",
unit="records")``: records, not events (a shed buffer never becomes events, so ``events_in`` and
the per-stage event accounting are untouched). Under ``drop_oldest`` lanes this keeps the older
queued events and sheds the newest buffer: under sustained overload one of the two is lost either
way, and this way costs nothing to lose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cuptistream.cupti.records import RecordLayouts, size_table
from cuptistream.plugin import Emitter

if TYPE_CHECKING:
    from cuptistream.pipeline.core import Pipeline

STAGE, REASON = "intake", "shed_before_decode"
PAUSE_S = 0.002
PAUSE_PER_BYTES = 256 * 1024  # a larger buffer waits PAUSE_S per this many bytes before it is shed
# Bytes of events per byte of activity buffer: 2.1 for kernel records (216 bytes each, 462 of
# events), 2.5-3.8 for the shipped captures' mixes (API records are small and their events not).
RESERVE_PER_BYTE = 3


class FrontDoor:
    """One per collector: decides, per activity buffer, whether a connection decodes it or sheds it.

    While overloaded, connections take turns (a lock), and each turn first waits ``PAUSE_S`` off
    the GIL for the lanes to make room: the pipeline thread that drains them needs the GIL, and
    connections shedding flat out took it (8 endless replay probes on one collector core
    delivered 230-270k events/s against 590-610k at 4). A buffer still without room after the
    pause is shed. The pause is ``PAUSE_S`` per ``PAUSE_PER_BYTES`` of the buffer (at least one):
    counting a shed buffer's records walks its headers, so shedding is capped in bytes per second,
    not buffers (a GPU's 4 MiB buffers hold ~30 times the records of the replayed captures', and a
    pause per buffer let 4 probes spend half the collector's GIL time counting what they shed).
    Past that the probes' slots fill and the probe's own accounting takes over (CUPTI counts the
    records it drops for want of a buffer; a replay waits for a slot). CUPTI's threads never wait
    on any of this.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._gate = threading.Lock()
        # Held while a connection decodes a buffer in the collector's own threads (not in a worker).
        self.decode_turn = threading.Lock()
        self._decoded = threading.Condition()  # notified as each admitted buffer is decoded
        self.in_flight = 0  # bytes reserved for the events of buffers admitted and not yet decoded

    def admit(
        self,
        data: memoryview | Callable[[], memoryview],
        valid: int,
        dropped: int,
        layouts: RecordLayouts,
        emitter: Emitter,
    ) -> bool:
        """True: decode the buffer, then call ``decoded(valid)``. False: it was shed and counted.
        ``data`` may be a function that gives it (buffers joined only if they are to be shed)."""
        if self.pipeline.intake.policy == "block":
            self._reserve_within_budget(RESERVE_PER_BYTE * valid)
            return True
        if overloaded(self.pipeline, self.in_flight):
            with self._gate:
                deadline = time.monotonic() + PAUSE_S * max(1, valid // PAUSE_PER_BYTES)
                with self._decoded:  # off the GIL while waiting
                    while overloaded(self.pipeline, self.in_flight):
                        if not overloaded(self.pipeline):
                            # Only the buffers being decoded would fill the lanes: wait for them
                            # (each one ends), keeping this buffer in its slot, rather than shed it.
                            self._decoded.wait(PAUSE_S)
                            continue
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._decoded.wait(min(left, PAUSE_S))  # the lanes' writes make room too
                if overloaded(self.pipeline) and shed(
                    data if isinstance(data, memoryview) else data(), valid, dropped, layouts, emitter
                ):
                    return False
        with self._decoded:
            self.in_flight += RESERVE_PER_BYTE * valid
        return True

    def _reserve_within_budget(self, need: int) -> None:
        """Under ``block``: wait (off the GIL) until the buffers being decoded leave room for this
        one's events under the memory budget, then reserve them. With none being decoded it goes
        at once, so the collector holds at most one buffer's events over its budget."""
        intake = self.pipeline.intake
        with self._decoded:
            while self.in_flight and intake.held_bytes + self.in_flight + need > intake.budget_bytes:
                self._decoded.wait(PAUSE_S)  # lanes' writes make room too: look again
            self.in_flight += need

    def decoded(self, valid: int) -> None:
        """The admitted buffer of ``valid`` bytes was decoded (its events are in the intake) or lost."""
        with self._decoded:
            self.in_flight -= RESERVE_PER_BYTE * valid
            self._decoded.notify_all()


def overloaded(pipeline: Pipeline, in_flight: int = 0) -> bool:
    """Whether the events of one more buffer would only be dropped downstream (see above), with
    ``in_flight`` bytes of events on their way from buffers being decoded."""
    intake = pipeline.intake
    if intake.policy == "block":
        return False
    if intake.policy == "drop_newest" and intake.held_bytes + in_flight >= intake.budget_bytes:
        return True
    running = [lane for lane in pipeline.lanes if not lane.stopped]
    backlog = intake.queued_bytes + in_flight  # decoded already or being decoded: for every lane
    return bool(running) and all(lane.saturated(backlog) for lane in running)


def count_records(data: memoryview, valid: int, layouts: RecordLayouts) -> int | None:
    """Records in ``data[:valid]`` from their headers alone (a step per record, nothing kept: 117
    against ``records.walk``'s 168 ns per record on the 2-core VM); None when a size is unknown or
    the records overrun the buffer (it is then decoded, which learns the size or reports it)."""
    table = size_table(layouts)
    limit = len(table)
    ints = memoryview(data).cast("B")[: valid - valid % 4].cast("i")
    offset = count = 0
    while offset < valid:
        kind = ints[offset >> 2]
        size = table[kind] if 0 <= kind < limit else 0
        if not size:
            return None
        offset += size
        count += 1
    return count if offset == valid else None


def count_lost(
    data: memoryview,
    valid: int,
    dropped: int,
    layouts: RecordLayouts,
    emitter: Emitter,
    stage: str,
    reason: str,
) -> int | None:
    """Count a buffer that will not be decoded as lost: CUPTI's own ``dropped`` count (as the
    decoder would report it) and its records, at ``stage`` for ``reason``. Returns the records;
    None, with nothing counted, where they cannot be counted without decoding."""
    records = count_records(data, valid, layouts) if valid else 0
    if records is None:
        return None
    if dropped:
        emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
    if records:
        emitter.report_loss(stage, reason, records, unit="records")
    return records


def shed(data: memoryview, valid: int, dropped: int, layouts: RecordLayouts, emitter: Emitter) -> bool:
    """Count one buffer as shed (``count_lost``). False: its records cannot be counted without
    decoding; decode it."""
    return count_lost(data, valid, dropped, layouts, emitter, STAGE, REASON) is not None
