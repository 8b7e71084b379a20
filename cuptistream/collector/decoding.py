"""One decode stream per activity source of a probe: raw CUPTI buffers in, encoded events out.

Decoding is bulk (``cuptistream.cupti.decode``: one walk, numpy gathers, and for the hot kinds
msgpack written column by column, ``cuptistream.cupti.columnar``) and happens here, in the
collector, so the observed program never pays for it. Each stream keeps its own record layouts,
name cache and open NVTX ranges.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from cuptistream.channel.messages import OpenStream
from cuptistream.collector.names import ProcessNames
from cuptistream.cupti import capture
from cuptistream.cupti.decode import Decoder
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import LayoutError, RecordLayouts, SizeLearner
from cuptistream.plugin import Emitter


def _stride_learner(data: memoryview, valid: int) -> SizeLearner | None:
    """Record sizes from libcupti's ``cuptiActivityGetNextRecord`` (for CUPTI releases without
    ``cuptiActivityGetStructSize``); None where libcupti cannot be loaded here."""
    try:
        from cuptistream.cupti import library

        lib = library.libcupti()
    except Exception:
        return None
    holder = (ctypes.c_char * valid).from_buffer(data) if not data.readonly else None
    if holder is None:
        return None
    base = ctypes.addressof(holder)

    def learn(kind: int, offset: int) -> int | None:
        record = ctypes.c_void_p(base + offset)
        code = lib.cuptiActivityGetNextRecord(base, valid, ctypes.byref(record))
        if code == library.ERROR_MAX_LIMIT_REACHED:
            return valid - offset
        if code != library.SUCCESS or not record.value:
            return None
        return int(record.value) - (base + offset)

    return learn


def _lazy(data: memoryview, valid: int) -> SizeLearner:
    """A learner that loads libcupti only if a record of unknown size turns up."""
    made: list[SizeLearner | None] = []

    def learn(kind: int, offset: int) -> int | None:
        if not made:
            made.append(_stride_learner(data, valid))
        inner = made[0]
        return inner(kind, offset) if inner is not None else None

    return learn


class DecodeStream:
    """``on_devices`` is told the device ordinals the records named so far, when they grow."""

    def __init__(
        self,
        info: OpenStream,
        pid: int,
        emitter: Emitter,
        on_devices: Callable[[set[int]], None] | None = None,
    ) -> None:
        self.info = info
        self.emitter = emitter
        self._on_devices = on_devices
        self._devices_told = 0
        self.origin = f"source:{info.source}"
        self.names: ProcessNames | TableNames = (
            TableNames(info.strings) if info.strings is not None else ProcessNames(pid)
        )
        self.decoder = Decoder(self.names, RecordLayouts(dict(info.struct_sizes)), info.demangle)
        self.buffers = 0
        self.events = 0
        self._name_failure_reported = False
        self._captured: list[capture.CapturedBuffer] = []

    @property
    def records(self) -> int:
        return self.decoder.records_decoded

    def decode(self, data: memoryview, valid: int, dropped: int) -> None:
        """Decode one buffer and emit its events. Never raises: failures become Loss/Error events."""
        if dropped:
            self.emitter.report_loss("cupti", "cupti_buffer_dropped", dropped, unit="records")
        if not valid:
            return
        self.buffers += 1
        if self.info.capture:
            self._captured.append(capture.CapturedBuffer(data=bytes(data[:valid]), dropped=dropped))
        try:
            chunks = self.decoder.decode_packed(data, valid, learn=_lazy(data, valid))
        except LayoutError as error:
            self.emitter.report_loss("cupti", "undecodable_buffer", 1, unit="buffers")
            self.emitter.report_error(self.origin, str(error))
            return
        except Exception as error:
            self.emitter.report_loss("cupti", "undecodable_buffer", 1, unit="buffers")
            self.emitter.report_error(self.origin, f"decoding a buffer failed: {error}")
            return
        devices = self.decoder.device_ids
        if self._on_devices is not None and len(devices) > self._devices_told:
            self._devices_told = len(devices)
            self._on_devices(set(devices))  # before the chunks, so their batches name the device
        for chunk in chunks:
            self.events += chunk.count
            self.emitter.emit_chunk(chunk)
        self._report_name_failure()

    def _report_name_failure(self) -> None:
        names = self.names
        if isinstance(names, ProcessNames) and names.failure and not self._name_failure_reported:
            self._name_failure_reported = True
            self.emitter.report_error(self.origin, names.failure, severity="warning")

    def close(self) -> None:
        names = self.names
        if isinstance(names, ProcessNames):
            if names.unresolved:
                self.emitter.report_loss("collector", "name_unresolved", names.unresolved, unit="names")
            names.close()
        if self.info.capture:
            strings = names.seen if isinstance(names, ProcessNames) else names.table
            capture.write(
                self.info.capture,
                capture.Capture(
                    name=self.info.source, cupti_version=self.info.cupti_version, device=self.info.device,
                    struct_sizes=dict(self.decoder.layouts.sizes), strings=dict(strings),
                    buffers=self._captured, clock=self.info.clock,
                ),
            )  # fmt: skip
