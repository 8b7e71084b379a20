"""The collector's memory as the kernel splits it: its own heap (anonymous RSS) apart from the
probes' slot pools it maps (shared RSS).

``memory_budget`` bounds what the collector allocates, not the probes' shared memory, which grows
with every probe (each maps its pools here) and is counted once per host whoever maps it. ``ru_maxrss``
adds the two, so an operator cannot tell a leak from sixteen probes' pools. ``/proc/PID/status``
has ``RssAnon`` and ``RssShmem``; the kernel keeps no peak of either, so ``MemoryWatch`` samples.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from cuptistream.cupti.libc import libc


@dataclass(frozen=True)
class MemoryReading:
    anon_kib: int = 0  # RssAnon: the collector's heap, stacks, numpy arrays, queued chunks
    shmem_kib: int = 0  # RssShmem: resident pages of shared memory it maps (the probes' slot pools)


def read(pid: int | str = "self") -> MemoryReading | None:
    """RssAnon and RssShmem of ``pid`` now; None where ``/proc`` lacks them (not Linux, process gone)."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    key, value = line.split(":", 1)
                    values[key] = int(value.split()[0])  # "  1234 kB"
    except (OSError, ValueError):
        return None
    if len(values) < 2:
        return None
    return MemoryReading(anon_kib=values["RssAnon"], shmem_kib=values["RssShmem"])


class MemoryWatch:
    """Samples this process's RssAnon and RssShmem every ``interval`` seconds on a daemon thread
    (one read of a small /proc file, ~20 µs) and keeps the peak of each.

    With ``trim_above_kib``, a sample over it hands the heap's free pages back to the kernel
    (``malloc_trim``), at most once per ``trim_every_s``. The collector's big allocations (a decode
    worker's reply of megabytes, whose events stay views into it until the sinks let go) come and
    go in glibc's heap, which keeps the pages of freed chunks: under many probes the collector holds
    tens of MiB of them over its budget. Trimming only then, and not at every sample, keeps the
    heap's reuse: fresh pages cost a fault each, and both a mapping per reply and trimming at every
    sample cost a measurable share of the collector's throughput (see docs/performance.md)."""

    def __init__(
        self,
        interval: float = 0.2,
        pid: int | str = "self",
        trim_above_kib: int = 0,
        trim_every_s: float = 0.5,
    ) -> None:
        self.interval = interval
        self.pid = pid
        self.trim_above_kib = trim_above_kib
        self.trim_every_s = trim_every_s
        self.trims = 0
        self.current = MemoryReading()
        self.peak = MemoryReading()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> MemoryReading:
        reading = read(self.pid)
        if reading is not None:
            self.current = reading
            self.peak = MemoryReading(
                max(self.peak.anon_kib, reading.anon_kib), max(self.peak.shmem_kib, reading.shmem_kib)
            )
        return self.current

    def start(self) -> MemoryWatch:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="cuptistream-memory", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_trim = 0.0
        while not self._stop.wait(self.interval):
            reading = self.sample()
            over = bool(self.trim_above_kib) and reading.anon_kib > self.trim_above_kib
            if over and time.monotonic() >= next_trim:
                next_trim = time.monotonic() + self.trim_every_s
                self.trims += trim_heap()

    def stop(self) -> MemoryReading:
        """Stop sampling; the reading at the end (the peak includes it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.sample()


_M_ARENA_MAX = -8  # glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas in the collector process (call before its threads start).

    glibc gives each new thread its own arena (up to 8 per core) and keeps what the thread freed in
    it; every probe connection decodes on its own thread, so each probe kept ~2 MiB of freed numpy
    temporaries in the collector (15 MiB at 8 probes, measured: bench/fanin.py with
    MALLOC_ARENA_MAX=1). The decode threads take turns on the GIL, so sharing arenas costs little.
    A ``MALLOC_ARENA_MAX`` the user set wins. False where this is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return _mallopt({_M_ARENA_MAX: arenas})


def _mallopt(settings: dict[int, int]) -> bool:
    """glibc's ``mallopt`` for each parameter and value. True if every one was taken; False where
    this is not glibc."""
    try:
        mallopt = libc().mallopt
    except (OSError, AttributeError):
        return False
    return all([bool(mallopt(parameter, value)) for parameter, value in settings.items()])  # sets all


def trim_heap() -> bool:
    """Give the pages of freed heap chunks back to the kernel (glibc's ``malloc_trim(0)``, which
    runs with the GIL released). False where this is not glibc or nothing was given back."""
    try:
        malloc_trim = libc().malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(malloc_trim(0))


def keep_freed_heap(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Keep a decode worker's freed temporaries in its heap for the next buffer (call at its start).

    Decoding one 4 MiB activity buffer allocates tens of megabytes of numpy temporaries (the
    gathered records, the packed rows, the reply). With glibc's defaults, the largest come from
    fresh mappings and the heap's top is handed back when freed, so every buffer would fault its
    pages in again, a large share of the worker's CPU. Allocations up to ``mmap_threshold`` come
    from the heap, and up to ``trim_threshold`` of free heap stays in
    it. A user's ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or malloc tunable in
    ``GLIBC_TUNABLES`` wins. False where this is not glibc or the user chose."""
    chosen = [os.environ.get(name) for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")]
    if any(chosen) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return _mallopt({_M_MMAP_THRESHOLD: mmap_threshold, _M_TRIM_THRESHOLD: trim_threshold})
