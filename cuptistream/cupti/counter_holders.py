"""Who may hold a GPU's performance counters: CUPTI says only that another client has them
(``CUPTI_ERROR_HARDWARE_BUSY``), and NVML names no owner, so the processes this host shows are
looked through for the profilers known to take them. A container without the host's pid namespace
sees none of the host's: then the message names the usual holders instead."""

from __future__ import annotations

from pathlib import Path

# Process name (``/proc/PID/comm``, at most 15 characters) -> what it is and how to free the counters.
KNOWN: dict[str, str] = {
    "nv-hostengine": "DCGM's profiling module (pause it: dcgmi profile --pause; resume: --resume)",
    "dcgm-exporter": "dcgm-exporter's profiling (DCP) fields (drop them, or dcgmi profile --pause)",
    "nsys": "Nsight Systems (GPU metrics sampling: end its session)",
    "ncu": "Nsight Compute (end the profiling session)",
}
GENERIC = "another profiling tool, e.g. DCGM's profiling module (dcgmi profile --pause) or Nsight"


def running(proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, name) of the known holders running and visible here, by pid."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if name in KNOWN:
            found.append((int(entry.name), name))
    return sorted(found)


def describe(proc: Path = Path("/proc")) -> str:
    """The likely holder and its fix, for one line."""
    try:
        found = running(proc)
    except OSError:
        found = []
    if not found:
        return GENERIC
    return "; ".join(f"{name} (pid {pid}) runs here: {KNOWN[name]}" for pid, name in found)
