"""The collector's CPU time per thread, by thread name: which of its threads is the one that is full.

A collector that cannot keep up is limited by one thread (the pipeline's, the file sink's zstd
writer, a probe connection's) long before its process uses all its cores; the process's CPU time
does not say which. ``ThreadCpu`` reads each thread's user + system time from
``/proc/self/task/<tid>/stat`` every ``interval`` seconds on a daemon thread and keeps each
thread's last reading, so threads that have ended (a probe's connection) still count, less what
they used after their last reading (at most ``interval`` of CPU each).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_UNNAMED = "(native threads)"  # not Python's: zstd's or numpy's own, if any


def cpu_seconds(stat_path: str) -> float | None:
    """User + system CPU seconds from a ``/proc`` ``stat`` file (a process's or a thread's); None
    once it is gone."""
    try:
        with open(stat_path, encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14 and 15


def read_thread_cpu(tid: int) -> float | None:
    """User + system CPU seconds of thread ``tid`` of this process; None once it is gone."""
    return cpu_seconds(f"/proc/self/task/{tid}/stat")


class ThreadCpu:
    """Samples every thread's CPU time every ``interval`` seconds (about 20 µs a thread); ``by_name``
    sums the last readings by thread name. Where ``/proc`` is missing it reports nothing."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._cpu: dict[int, float] = {}  # tid -> CPU seconds at its last reading
        # tid -> the names it was seen under: trio names a worker thread after the job it runs
        # ("_write from FileSink.write..."), so a thread is labelled by its most frequent one.
        self._names: dict[int, Counter[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        try:
            tids = [int(tid) for tid in os.listdir("/proc/self/task")]
        except OSError:
            return
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        with self._lock:
            for tid in tids:
                cpu = read_thread_cpu(tid)
                if cpu is not None:
                    self._cpu[tid] = cpu
                    self._names.setdefault(tid, Counter())[names.get(tid, _UNNAMED)] += 1

    def sample_this_thread(self) -> None:
        """The calling thread's reading, as its last act: its work after the last periodic sample
        counts too (the pipeline's thread drains for most of a shutdown)."""
        tid = threading.get_native_id()
        cpu = read_thread_cpu(tid)
        if cpu is not None:
            with self._lock:
                self._cpu[tid] = cpu
                self._names.setdefault(tid, Counter())[threading.current_thread().name] += 1

    def _name(self, tid: int) -> str:
        seen = self._names.get(tid)
        return seen.most_common(1)[0][0] if seen else _UNNAMED

    def start(self) -> ThreadCpu:
        self._thread = threading.Thread(target=self._run, name="cuptistream-thread-cpu", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> dict[str, float]:
        """Stop sampling; CPU seconds by thread name, with a reading taken now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()
        return self.by_name()

    def by_name(self) -> dict[str, float]:
        """CPU seconds by thread name (threads of one name summed), largest first."""
        totals: dict[str, float] = {}
        with self._lock:
            for tid, cpu in self._cpu.items():
                name = self._name(tid)
                totals[name] = totals.get(name, 0.0) + cpu
        ranked = sorted(totals.items(), key=lambda item: -item[1])
        return {name: round(cpu, 3) for name, cpu in ranked if cpu > 0}

    def busiest(self) -> tuple[str, float]:
        """The one thread with the most CPU time: its name and CPU seconds (("", 0.0): none)."""
        with self._lock:
            if not self._cpu:
                return "", 0.0
            tid = max(self._cpu, key=self._cpu.__getitem__)
            return self._name(tid), round(self._cpu[tid], 3)
