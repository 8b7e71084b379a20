"""A cuptistream sink from outside the project: every kernel as one CSV row, the rest counted by tag.

Written from docs/architecture.md only (the component contract), as a tool builder would.
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter

import trio

from cuptistream.plugin import (
    OutgoingBatch,
    RetryableError,
    Sink,
    SinkConfig,
    SinkUnavailableError,
    Size,
    events,
)

COLUMNS = ["pid", "host", "seq", "name", "device_id", "stream_id", "start_unix_ns", "duration_ns"]


class CsvKernelSinkConfig(SinkConfig):
    """``type: csv_kernels``."""

    path: str = "kernels.csv"
    max_file_bytes: Size = Size(64 * 1024 * 1024)  # refuse to grow the file past this

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.path:
            raise ValueError("path: give a file name, e.g. kernels.csv")


class CsvKernelSink(Sink):
    config_type = CsvKernelSinkConfig

    def __init__(self, config: CsvKernelSinkConfig) -> None:
        super().__init__(config)
        self.config: CsvKernelSinkConfig = config
        self._file: io.TextIOWrapper | None = None
        self.rows = 0
        self.batches = 0
        self.tags: Counter[str] = Counter()

    async def open(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.config.path))
        if not os.path.isdir(directory):
            raise SinkUnavailableError(
                f"{self.where('path')}: {directory} is not a directory; create it first"
            )
        self._file = await trio.to_thread.run_sync(self._open)

    def _open(self) -> io.TextIOWrapper:
        file = open(self.config.path, "w", newline="", encoding="utf-8")  # noqa: SIM115 - closed in close()
        csv.writer(file).writerow(COLUMNS)
        return file

    async def write(self, batch: OutgoingBatch) -> None:
        # A RetryableError raised here is retried by the pipeline under this sink's ``retry`` keys.
        await trio.to_thread.run_sync(self._write, batch)

    def _write(self, batch: OutgoingBatch) -> None:
        assert self._file is not None
        decoded = batch.batch
        offset = decoded.clock.offset_ns
        rows = []
        for event in decoded.events:
            self.tags[type(event).__struct_config__.tag] += 1
            if isinstance(event, events.Kernel):
                rows.append([
                    batch.resource.pid if batch.resource else "", batch.resource.host if batch.resource else "",
                    batch.seq, event.name, event.device_id, event.stream_id, event.start + offset,
                    event.end - event.start,
                ])  # fmt: skip
        if self._file.tell() > self.config.max_file_bytes:
            raise RetryableError("file full")  # a real sink might wait for rotation; here it gives up
        csv.writer(self._file).writerows(rows)
        self._file.flush()
        self.rows += len(rows)
        self.batches += 1

    async def close(self) -> None:
        if self._file is not None:
            await trio.to_thread.run_sync(self._file.close)
            self._file = None

    def stats(self) -> dict[str, int]:
        return {"rows": self.rows, "batches": self.batches, **{f"tag_{t}": n for t, n in self.tags.items()}}
