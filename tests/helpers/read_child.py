"""Child process for the bounded-memory tests: reads a recording with ``cuptistream.read`` and prints
one JSON line: batches read, the damage found, and peak RSS (KiB) before and after reading."""

from __future__ import annotations

import json
import resource
import sys
import warnings

from cuptistream.reader import read


def main() -> None:
    reader = read(sys.argv[1])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        count = sum(1 for _ in reader.batches())
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    damage = [[d.offset, d.length, d.problem] for d in reader.damage]
    print(json.dumps({"batches": count, "damage": damage, "rss_before_kib": before, "rss_after_kib": after}))


if __name__ == "__main__":
    main()
