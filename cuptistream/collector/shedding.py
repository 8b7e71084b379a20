"""The collector's front door: under overload, whole activity buffers are dropped BEFORE decoding.

Decoding, packing and encoding are most of the collector's per-record cost (docs/benchmarks.md,
issue 30). When the pipeline cannot take more events, decoding a buffer only to drop its events at
a full lane spends the CPU that the buffers it can still deliver need: under 2x overload the
collector then delivered less than at 1x. So while nothing downstream has room, a connection
counts the buffer's records (a walk over the record headers, no gathers, no events) and releases
the slot:

- the memory budget is full under ``drop_newest`` (the intake would refuse the events), or
- every running lane is saturated (``SinkLane.saturated``: full under a dropping policy, the
  intake's backlog counted, since all of it is bound for every lane).

Nothing is shed under ``block`` (the connection waits instead, and so does the probe's hand-off) or
while some lane has room. The loss is ``Loss(stage="intake", reason="shed_before_decode",
unit="records")``: records, not events (a shed buffer never becomes events, so ``events_in`` and
the per-stage event accounting are untouched). Under ``drop_oldest`` lanes this keeps the older
queued events and sheds the newest buffer: under sustained overload one of the two is lost either
way, and this way costs nothing to lose.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from cuptistream.cupti.records import LayoutError, RecordLayouts, walk
from cuptistream.plugin import Emitter

if TYPE_CHECKING:
    from cuptistream.pipeline.core import Pipeline

STAGE, REASON = "intake", "shed_before_decode"
PAUSE_S = 0.002


class FrontDoor:
    """One per collector: decides, per activity buffer, whether a connection decodes it or sheds it.

    While overloaded, connections take turns (a lock), and each turn first waits ``PAUSE_S`` off
    the GIL for the lanes to make room: the pipeline thread that drains them needs the GIL, and
    connections shedding flat out took it (8 endless replay probes on one collector core
    delivered 230-270k events/s against 590-610k at 4). A buffer still without room after the
    pause is shed. Shedding is thereby capped at one buffer per ``PAUSE_S``; past that the probes'
    slots fill and the probe's own accounting takes over (CUPTI counts the records it drops for
    want of a buffer; a replay waits for a slot). CUPTI's threads never wait on any of this.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._gate = threading.Lock()

    def admit(
        self, data: memoryview, valid: int, dropped: int, layouts: RecordLayouts, emitter: Emitter
    ) -> bool:
        """True: decode the buffer. False: it was shed and counted."""
        if not overloaded(self.pipeline):
            return True
        with self._gate:
            time.sleep(PAUSE_S)
            return not (overloaded(self.pipeline) and shed(data, valid, dropped, layouts, emitter))


def overloaded(pipeline: Pipeline) -> bool:
    """Whether the events of one more buffer would only be dropped downstream (see above)."""
    intake = pipeline.intake
    if intake.policy == "block":
        return False
    if intake.policy == "drop_newest" and intake.held_bytes >= intake.budget_bytes:
        return True
    running = [lane for lane in pipeline.lanes if not lane.stopped]
    backlog = intake.queued_bytes  # decoded already, and bound for every lane
    return bool(running) and all(lane.saturated(backlog) for lane in running)


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
