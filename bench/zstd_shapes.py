"""zstd on the file sink's batches, by shape (issue 30): threads, frame size and parameters.

    python bench/zstd_shapes.py [--rounds 5] [CAPTURE]   # default: W3's H100 buffers

The capture's events, encoded as the collector encodes them (``zstd_levels.payload``), are cut
into pieces of a batch's size (4 MiB) and compressed piece by piece, as the file sink does, in
interleaved rounds. Per setting: the process's CPU time per byte (zstd's own worker threads
included) as GB/s per core, the wall-clock rate, and the ratio; median [min .. max] over the rounds.

- ``threads``: level 1 with zstd's own worker threads (0, 2, 4): one frame either way;
- ``frame``: level 1 on pieces of 0.5-4 MiB (smaller frames, one thread each);
- ``params``: level 1's fast strategy with other windows, hash tables and minimum matches, and
  level -1.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import zstandard
from zstd_levels import W3, payload

BATCH = 4 << 20
Setting = tuple[str, Callable[[], zstandard.ZstdCompressor], int]  # name, compressor, piece size


def _level(level: int, threads: int = 0) -> Callable[[], zstandard.ZstdCompressor]:
    return lambda: zstandard.ZstdCompressor(
        level=level, threads=threads, write_content_size=True, write_checksum=True
    )


def _fast(window: int, hashes: int, match: int) -> Callable[[], zstandard.ZstdCompressor]:
    params = zstandard.ZstdCompressionParameters(
        window_log=window, hash_log=hashes, chain_log=16, search_log=1, min_match=match,
        target_length=0, strategy=zstandard.STRATEGY_FAST, write_content_size=True, write_checksum=True,
    )  # fmt: skip
    return lambda: zstandard.ZstdCompressor(compression_params=params)


def settings() -> list[Setting]:
    out: list[Setting] = [(f"threads {t}", _level(1, t), BATCH) for t in (0, 2, 4)]
    out += [(f"frame {size >> 10} KiB", _level(1), size) for size in (4 << 20, 2 << 20, 1 << 20, 512 << 10)]
    out.append(("level -1", _level(-1), BATCH))
    for window, hashes, match in itertools.product((17, 19, 22), (14, 16, 17), (5, 6, 7)):
        out.append((f"fast w{window} h{hashes} m{match}", _fast(window, hashes, match), BATCH))
    return out


def measure(data: bytes, rounds: int) -> dict[str, tuple[list[float], list[float], float]]:
    """Per setting: CPU GB/s and wall GB/s per round, and the ratio."""
    found: dict[str, tuple[list[float], list[float], float]] = {}
    made = [(name, make(), size) for name, make, size in settings()]
    for _ in range(rounds):
        for name, compressor, size in made:  # interleaved: every setting sees the same machine
            pieces = [data[i : i + size] for i in range(0, len(data) - size + 1, size)] * max(
                1, BATCH // size
            )
            total = sum(map(len, pieces))
            cpu, wall = time.process_time(), time.perf_counter()
            out = sum(len(compressor.compress(piece)) for piece in pieces)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            cpus, walls, _ = found.setdefault(name, ([], [], 0.0))
            cpus.append(total / cpu / 1e9)
            walls.append(total / wall / 1e9)
            found[name] = (cpus, walls, total / out)
    return found


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f} .. {max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture", nargs="?", type=Path, default=W3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data, count = payload(args.capture)
    if len(data) < BATCH:
        parser.exit(
            2,
            f"zstd_shapes: {args.capture} encodes to {len(data)} bytes, under one {BATCH >> 20} MiB batch; give a GPU-sized capture (bench/capture_stream.py)\n",
        )
    print(f"{args.capture.name}: {count} events, {len(data) / count:.0f} bytes/event, {args.rounds} rounds")
    print("| setting | CPU GB/s per core | wall GB/s | ratio |\n|---|---|---|---|")
    for name, (cpus, walls, ratio) in measure(data, args.rounds).items():
        print(f"| {name} | {spread(cpus)} | {spread(walls)} | {ratio:.1f} |")


if __name__ == "__main__":
    main()
