"""The collector's front door: under overload, whole activity buffers are dropped BEFORE decoding.

Decoding, packing and encoding are most of the collector's per-record cost (docs/benchmarks.md,
issue 30). When the pipeline cannot take more events, decoding a buffer only to drop its events at
a full lane spends the CPU that the buffers it can still deliver need: under 2x overload the
collector then delivered less than at 1x. So while nothing downstream has room, a connection
counts the buffer's records (a walk over the record headers, no gathers, no events) and releases
the slot:

- the intake is full under ``drop_newest`` (it would refuse the events), or
- every running lane is saturated (``SinkLane.saturated``: full under a dropping policy).

Nothing is shed under ``block`` (the connection waits instead, and so does the probe's hand-off) or
while some lane has room. The loss is ``Loss(stage="intake", reason="shed_before_decode",
unit="records")``: records, not events (a shed buffer never becomes events, so ``events_in`` and
the per-stage event accounting are untouched). Under ``drop_oldest`` lanes this keeps the older
queued events and sheds the newest buffer: under sustained overload one of the two is lost either
way, and this way costs nothing to lose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuptistream.cupti.records import LayoutError, RecordLayouts, walk
from cuptistream.plugin import Emitter

if TYPE_CHECKING:
    from cuptistream.pipeline.core import Pipeline

STAGE, REASON = "intake", "shed_before_decode"


def overloaded(pipeline: Pipeline) -> bool:
    """Whether the events of one more buffer would only be dropped downstream (see above)."""
    intake = pipeline.intake
    if intake.policy == "block":
        return False
    if intake.policy == "drop_newest" and intake.queued_bytes >= intake.budget_bytes:
        return True
    running = [lane for lane in pipeline.lanes if not lane.stopped]
    return bool(running) and all(lane.saturated for lane in running)


def count_records(data: memoryview, valid: int, layouts: RecordLayouts) -> int | None:
    """Records in ``data[:valid]`` from their headers alone; None when a size is unknown (the
    buffer is then decoded, which learns it)."""
    try:
        offsets = walk(memoryview(data).cast("B"), valid, layouts, None)
    except LayoutError:
        return None
    return sum(len(kind) for kind in offsets.values())


def shed(data: memoryview, valid: int, dropped: int, layouts: RecordLayouts, emitter: Emitter) -> bool:
    """Count one buffer as shed (and CUPTI's own ``dropped`` count as the decoder would). False:
    its records cannot be counted without decoding; decode it."""
    records = count_records(data, valid, layouts) if valid else 0
    if records is None:
        return False
    if dropped:
        emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
    emitter.report_loss(STAGE, REASON, records, unit="records")
    return True
