"""Draining: GetData into a few pooled buffers per context (only the C calls, on whichever thread
drains), then decoding the filled buffers on the worker and publishing PcSampleBatch events and losses."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuptistream.cupti import pcsampling_api as pcs
from cuptistream.cupti.sampling_decode import LiveMemory, PcData, decode_pc_data
from cuptistream.cupti.watchdog import Watchdog
from cuptistream.events import PcSample, PcSampleBatch
from cuptistream.plugin import Emitter

from .adapt import Adaptation
from .context import SampledContext

STAGE = "pc_sampling"
EVENT_PCS = 200  # at most this many PCs per pc_samples event (see Drains.publish) ...
EVENT_BYTES = 48 * 1024  # ... and about this many bytes, under the smallest event buffer (64 KiB)

# GetData buffers per context: one being filled while up to three wait for the worker to decode.
# Each holds collect_pcs x (PC record + stall reasons), about 1.5 MB at the defaults.
_BUFFERS_PER_CONTEXT = 4


@dataclass
class Filled:
    """A buffer CUPTI filled (GetData, or Disable's final buffer), waiting to be decoded."""

    state: SampledContext
    buffer: pcs.SamplingBuffer
    at_end: bool = False


class Drains:
    """GetData into pooled buffers, and the queue of filled buffers the worker decodes and emits."""

    def __init__(
        self,
        contexts: dict[int, SampledContext],
        adaptation: Adaptation,
        stats: dict[str, float],
        emitter: Emitter,
        now: Callable[[], int],
        watchdog: Watchdog,
        watched: Callable[..., Any],
        wake: threading.Event,
    ) -> None:
        self._contexts = contexts  # the sampled contexts (attach.Contexts adds and removes them)
        self._adaptation = adaptation
        self.stats = stats
        self.emitter = emitter
        self._now = now
        self._watchdog = watchdog
        self._watched = watched
        self._wake = wake
        self._names: dict[int, str] = {}  # function-name cache by pointer
        self.filled: collections.deque[Filled] = collections.deque()  # GetData/Disable output to decode
        self._decode_lock = threading.Lock()

    def drain(self, state: SampledContext) -> None:
        if self._watchdog.wedged.is_set():
            return
        with state.lock:
            if state.ctx in self._contexts and state.enabled:
                self.drain_locked(state)

    def drain_locked(self, state: SampledContext) -> None:
        """GetData until CUPTI has no more PCs for us (bounded). Only the C calls run here, on
        whichever thread drains (often the application's, inside a launch); the worker decodes."""
        for _ in range(64):
            buffer = self._take_buffer(state)
            buffer.reset()
            began = time.perf_counter()
            code = self._watched("cuptiPCSamplingGetData", pcs.get_data, state.ctx, buffer.data)
            self.stats["get_data_calls"] += 1
            self.stats["get_data_s"] += time.perf_counter() - began
            if code != pcs.SUCCESS:
                state.spare.append(buffer)
                if code != pcs.ERROR_OUT_OF_MEMORY:
                    raise pcs.CuptiError("cuptiPCSamplingGetData", code, pcs.result_string(code))
                self.emitter.report_loss(STAGE, "hardware_buffer_full", 1, unit="buffers")
                self._adaptation.adapt(state, "the hardware buffer filled")
                return
            remaining, total = int(buffer.data.remainingNumPcs), int(buffer.data.totalNumPcs)
            self.hand_off(Filled(state, buffer))
            if not remaining or not total:
                return
        self._adaptation.adapt(state, f"{remaining} PCs were still waiting after 64 drains")

    def _take_buffer(self, state: SampledContext) -> pcs.SamplingBuffer:
        """A free GetData buffer; if all are waiting to be decoded, decode them here (back-pressure)."""
        if not state.spare and state.buffers >= _BUFFERS_PER_CONTEXT:
            self.decode_filled()
        if state.spare:
            return state.spare.pop()
        state.buffers += 1
        return pcs.SamplingBuffer(*state.buffer_shape)

    def hand_off(self, filled: Filled) -> None:
        self.filled.append(filled)
        self._wake.set()

    def decode_filled(self) -> None:
        """Decode and emit every filled buffer, in order, and return GetData buffers to their pool."""
        with self._decode_lock:
            while self.filled:
                filled = self.filled.popleft()
                began = time.perf_counter()
                state = filled.state
                data = decode_pc_data(LiveMemory(), filled.buffer.address, state.stall_names, self._names)
                if filled.buffer is not state.final:
                    state.spare.append(filled.buffer)
                self.publish(state, data, at_end=filled.at_end)
                self.stats["pcs"] += data.total_num_pcs
                self.stats["function_names"] = len(self._names)
                self.stats["decode_s"] += time.perf_counter() - began

    def publish(self, state: SampledContext, data: PcData, at_end: bool = False) -> None:
        if data.samples or data.total_samples or data.dropped_samples:
            # One event per EVENT_PCS PCs: a drain of thousands of PCs encodes to megabytes, more
            # than one event buffer to the collector holds. Each event's total_samples is its PCs'
            # samples; the first also carries what CUPTI counted beyond them, so the totals add up.
            timestamp = self._now()
            pieces = _pieces(data.samples) or [[]]
            in_pcs = [sum(sum(sample.stalls.values()) for sample in piece) for piece in pieces]
            beyond = data.total_samples - sum(in_pcs)
            self.emitter.emit(
                [
                    PcSampleBatch(
                        timestamp=timestamp,
                        device_id=state.device_id,
                        context_id=state.context_id,
                        range_id=data.range_id,
                        samples=piece,
                        total_samples=samples + (beyond if first else 0),
                        non_user_samples=data.non_user_samples if first else 0,
                        dropped_samples=data.dropped_samples if first else 0,
                        hardware_buffer_full=data.hardware_buffer_full and first,
                        sampling_period=state.period,
                    )
                    for first, piece, samples in zip(
                        [True] + [False] * (len(pieces) - 1), pieces, in_pcs, strict=True
                    )
                ]
            )
            self.stats["batches"] += 1
            self.stats["samples"] += data.total_samples
        lost = False
        if data.dropped_samples:
            self.stats["dropped"] += data.dropped_samples
            self.emitter.report_loss(STAGE, "hardware_dropped", data.dropped_samples, unit="samples")
            lost = True
        if data.hardware_buffer_full:
            self.emitter.report_loss(STAGE, "hardware_buffer_full", 1, unit="buffers")
            lost = True
        if at_end and data.remaining_num_pcs:
            self.emitter.report_loss(STAGE, "not_collected_at_disable", data.remaining_num_pcs, unit="pcs")
        if lost and not at_end:
            self._adaptation.adapt(state, "samples were lost")


def _pieces(samples: list[PcSample]) -> list[list[PcSample]]:
    """``samples`` cut into runs of at most EVENT_PCS PCs and about EVENT_BYTES encoded bytes."""
    pieces: list[list[PcSample]] = []
    piece: list[PcSample] = []
    size = 0
    for sample in samples:
        cost = 48 + len(sample.function_name) + 24 * len(sample.stalls)  # msgpack, roughly, from above
        if piece and (len(piece) >= EVENT_PCS or size + cost > EVENT_BYTES):
            pieces.append(piece)
            piece, size = [], 0
        piece.append(sample)
        size += cost
    if piece:
        pieces.append(piece)
    return pieces
