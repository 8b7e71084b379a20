"""Child process for the sealing tests: a file sink's writer that stays alive. It appends ``count``
batches through a SegmentWriter (prefix ``cuptistream``), prints its ``.tmp`` path, then waits to be
killed, holding the file as a live collector would."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, for helpers.*

from helpers.batchgen import batch_bytes

from cuptistream.recording.segments import SegmentWriter


def main() -> None:
    directory, count = sys.argv[1], int(sys.argv[2])
    writer = SegmentWriter(
        directory, prefix="cuptistream", suffix=".msgpack.zst", rotate_age=0, fsync="never"
    )
    for seq in range(count):
        writer.append(batch_bytes(seq, 20, kinds=True))
    print(writer.temp_path, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
