"""Child process for the bounded-memory tests: reads a recording with ``cuptistream.read`` and prints
one JSON line: batches read, the damage found, and peak RSS (KiB) before and after reading."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from cuptistream.recording.reader import read


def peak_rss_kib() -> int:
    """This process's peak RSS since exec (VmHWM). Not ru_maxrss: it keeps the forking parent's RSS."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def main() -> None:
    reader = read(sys.argv[1])
    before = peak_rss_kib()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        count = sum(1 for _ in reader.batches())
    after = peak_rss_kib()
    damage = [[d.offset, d.length, d.problem] for d in reader.damage]
    print(json.dumps({"batches": count, "damage": damage, "rss_before_kib": before, "rss_after_kib": after}))


if __name__ == "__main__":
    main()
