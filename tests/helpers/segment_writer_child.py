"""Child process for the kill -9 test: appends batches through a SegmentWriter forever and prints
each batch's seq on its own line once the append has returned (the frame is in the file)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, for helpers.*

from helpers.batchgen import batch_bytes

from cuptistream.recording.segments import SegmentWriter


def main() -> None:
    directory, rotate_bytes = sys.argv[1], int(sys.argv[2])
    writer = SegmentWriter(
        directory,
        prefix="kill",
        suffix=".msgpack.zst",
        rotate_bytes=rotate_bytes,
        rotate_age=0,
        fsync="never",
    )
    seq = 0
    while True:
        writer.append(batch_bytes(seq, 50, kinds=True))
        sys.stdout.write(f"{seq}\n")
        sys.stdout.flush()
        seq += 1


if __name__ == "__main__":
    main()
