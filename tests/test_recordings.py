"""Recordings you can trust: checksummed frames, damage reported with file and offset and skipped to
the next intact frame and file, decompression bounded, orphaned ``.tmp`` files sealed (never a live
writer's), ``cuptistream repair``. Real files and real child processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import trio
import zstandard
from helpers.batchgen import batch_bytes, outgoing
from helpers.zstd_craft import MAGIC, rle_frame

from cuptistream.config import convert
from cuptistream.recording import jsonl
from cuptistream.recording.codec import encode_batch_object
from cuptistream.recording.framing import MAX_FRAME_BYTES, Damage, Frame, FrameEncoder, scan_frames
from cuptistream.recording.reader import Reader, read
from cuptistream.recording.segments import SegmentWriter
from cuptistream.sinks.file import FileSink, FileSinkConfig

HELPERS = Path(__file__).parent / "helpers"


def write_recording(path: Path, seqs: range, events: int = 5) -> list[tuple[int, int]]:
    """One file of one frame per batch; returns each frame's (offset, end)."""
    encoder = FrameEncoder()
    spans, data = [], b""
    for seq in seqs:
        frame = encoder.frame(batch_bytes(seq, events, kinds=True))
        spans.append((len(data), len(data) + len(frame)))
        data += frame
    path.write_bytes(data)
    return spans


def read_all(path: Path) -> tuple[list[bytes], list[Damage]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = read(path)
        batches = [encode_batch_object(b) for b in reader.batches()]
    return batches, reader.damage


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", *args], capture_output=True, text=True, timeout=120
    )


# --- checksums and damage ---------------------------------------------------------------------


def test_frames_carry_content_size_and_checksum(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, prefix="p", suffix=".msgpack.zst", rotate_age=0)
    writer.append(batch_bytes(0, 10))
    final = writer.close()
    assert final is not None
    params = zstandard.get_frame_parameters(final.read_bytes())
    assert params.has_checksum and params.content_size == len(batch_bytes(0, 10))


def test_every_single_bit_flip_is_caught_or_harmless(tmp_path: Path) -> None:
    """A bit flipped at every byte of a file: no wrong batch is ever returned, every frame the flip
    did not touch is returned, and a lost frame is always reported at the flipped frame's offset."""
    path = tmp_path / "r.msgpack.zst"
    spans = write_recording(path, range(4), events=3)
    clean = path.read_bytes()
    originals = [batch_bytes(seq, 3, kinds=True) for seq in range(4)]
    for position in range(len(clean)):
        damaged = bytearray(clean)
        damaged[position] ^= 1 << (position % 8)
        path.write_bytes(damaged)
        batches, damage = read_all(path)
        hit = next(i for i, (start, end) in enumerate(spans) if start <= position < end)
        others = [b for i, b in enumerate(originals) if i != hit]
        assert batches in (originals, others), position  # never a changed batch, never one too few
        if batches == others:
            assert damage, position  # the loss is reported...
            assert any(d.offset <= position < d.offset + d.length for d in damage), (position, damage)
            assert all(d.path == str(path) for d in damage)


def test_old_frames_without_checksum_still_read(tmp_path: Path) -> None:
    old = zstandard.ZstdCompressor(level=3, write_content_size=True)  # how frames were written before
    path = tmp_path / "old.msgpack.zst"
    path.write_bytes(b"".join(old.compress(batch_bytes(seq, 5, kinds=True)) for seq in range(3)))
    batches, damage = read_all(path)
    assert batches == [batch_bytes(seq, 5, kinds=True) for seq in range(3)] and damage == []


def test_damage_in_the_middle_keeps_every_intact_frame_behind_it(tmp_path: Path) -> None:
    path = tmp_path / "r.msgpack.zst"
    spans = write_recording(path, range(6))
    data = bytearray(path.read_bytes())
    originals = [batch_bytes(seq, 5, kinds=True) for seq in range(6)]
    # frame 1: its middle overwritten; frame 3: cut short (its end missing); garbage after frame 4.
    start, end = spans[1]
    data[start + 20 : end - 10] = b"\xaa" * (end - 30 - start)
    start3, end3 = spans[3]
    del data[end3 - 9 : end3]
    garbage_at = spans[4][1] - 9
    data[garbage_at:garbage_at] = b"not a frame at all"
    path.write_bytes(data)
    batches, damage = read_all(path)
    assert batches == [originals[i] for i in (0, 2, 4, 5)]
    assert [d.offset for d in damage] == [spans[1][0], start3, garbage_at]
    assert not any(d.torn for d in damage)  # damage followed by intact frames is corruption
    assert "not a zstd frame" in damage[2].problem
    assert all(d.describe().startswith(f"{path}: ") and "\n" not in d.describe() for d in damage)


def test_one_bad_file_does_not_stop_a_directory(tmp_path: Path) -> None:
    """Foreign, corrupt and torn files among good ones: `cuptistream cat` and `read` return every
    intact batch of every file and report each problem on one line with its file and offset."""
    write_recording(tmp_path / "a.msgpack.zst", range(0, 3))
    (tmp_path / "b.msgpack.zst").write_bytes(b"PK\x03\x04 a zip file, not ours")
    spans = write_recording(tmp_path / "c.msgpack.zst", range(3, 6))
    corrupt = bytearray((tmp_path / "c.msgpack.zst").read_bytes())
    corrupt[spans[1][0] + 30] ^= 0x10
    (tmp_path / "c.msgpack.zst").write_bytes(corrupt)
    (tmp_path / "d.msgpack.zst").write_bytes(zstandard.ZstdCompressor().compress(b"\x93\x01\x02\x03"))
    (tmp_path / "e.jsonl.zst").write_bytes(FrameEncoder().frame(b'{"just": "json"}\n'))
    (tmp_path / "f.jsonl").write_bytes(b"".join(jsonl.encode_batch(outgoing(s, 4).batch) for s in (6, 7)))
    write_recording(tmp_path / "g.msgpack.zst", range(8, 10))
    torn = (tmp_path / "g.msgpack.zst").read_bytes()
    (tmp_path / "g.msgpack.zst").write_bytes(torn[:-5])

    reader = read(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seqs = [b.seq for b in reader.batches()]
    assert seqs == [0, 1, 2, 3, 5, 6, 7, 8]
    assert [Path(d.path).name for d in reader.damage] == ["b.msgpack.zst", "c.msgpack.zst", "d.msgpack.zst",
                                                          "e.jsonl.zst", "g.msgpack.zst"]  # fmt: skip
    assert len(caught) == len(reader.damage)
    problems = [d.problem for d in reader.damage]
    assert problems[0].startswith("not a cuptistream file") and problems[2].startswith(
        "not a cuptistream file"
    )
    assert problems[1].startswith("corrupt frame") and reader.damage[1].offset == spans[1][0]
    assert reader.damage[-1].torn

    result = cli("cat", str(tmp_path))
    assert result.returncode == 1  # corruption is an error; the output is still complete
    assert [
        json.loads(line)["seq"] for line in result.stdout.splitlines() if '"type":"batch"' in line
    ] == seqs
    lines = result.stderr.splitlines()
    assert len(lines) == 5 and all(line.startswith(f"cuptistream: {tmp_path}/") for line in lines), lines
    assert "corrupt frame" in lines[1] and f"at offset {spans[1][0]}" in lines[1]
    # Torn tails alone are what a killed writer leaves: exit 0, unless --strict.
    for name in "bcde":
        (tmp_path / f"{name}.{'jsonl.zst' if name == 'e' else 'msgpack.zst'}").unlink()
    assert cli("cat", str(tmp_path)).returncode == 0
    assert cli("cat", "--strict", str(tmp_path)).returncode == 1


# --- bounded decompression and work -----------------------------------------------------------


def test_decompression_bombs_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    """128 KiB files that decompress to 4 GiB (declared, or only found out by decompressing) and a
    frame declaring more than the limit are skipped as damage by a reader whose peak RSS grows by
    less than 32 MiB; the good file next to them is read whole."""
    (tmp_path / "a-declared.msgpack.zst").write_bytes(rle_frame(4 << 30, declare=True))
    (tmp_path / "b-undeclared.msgpack.zst").write_bytes(rle_frame(4 << 30, declare=False))
    (tmp_path / "c-over.msgpack.zst").write_bytes(rle_frame(MAX_FRAME_BYTES + 1, declare=True))
    write_recording(tmp_path / "d-good.msgpack.zst", range(5))
    assert (tmp_path / "b-undeclared.msgpack.zst").stat().st_size < 130 * 1024
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, str(HELPERS / "read_child.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["batches"] == 5
    problems = [problem for _, _, problem in result["damage"]]
    assert len(problems) == 3
    assert "declares 4294967296 bytes" in problems[0] and "declares" in problems[2]
    assert "decompresses to more than" in problems[1]
    grown_mib = (result["rss_after_kib"] - result["rss_before_kib"]) / 1024
    assert grown_mib < 32, grown_mib
    assert elapsed < 30


def test_frames_without_a_declared_size_read_within_the_bound() -> None:
    streamed = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True).compressobj()
    frame = streamed.compress(b"x" * 300_000) + streamed.flush()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    (found,) = scan_frames(frame)
    assert isinstance(found, Frame) and found.payload == b"x" * 300_000
    (refused,) = scan_frames(frame, max_frame_bytes=100_000)
    assert isinstance(refused, Damage) and "more than the 100000-byte limit" in refused.problem


@pytest.mark.parametrize(
    "unit",
    [MAGIC, MAGIC + b"\x00\x38", MAGIC + b"\xc0\x38" + (1 << 20).to_bytes(8, "little") + b"\x02\x00\x08"],
    ids=["magic", "magic-header", "magic-header-block"],
)
def test_hostile_bytes_are_scanned_in_linear_time(unit: bytes) -> None:
    """2 MiB of frame magics (bare, with a header, with a header and a block), each a false start:
    one damaged range is reported, in seconds (about 4 us per false start), not hours."""
    data = unit * (2 * 1024 * 1024 // len(unit))
    started = time.monotonic()
    found = list(scan_frames(data))
    assert time.monotonic() - started < 15
    assert len(found) == 1 and isinstance(found[0], Damage) and found[0].length == len(data)


# --- sealing and repair -----------------------------------------------------------------------


def open_file_sink(directory: Path) -> None:
    sink = FileSink(convert({"type": "file", "directory": str(directory)}, FileSinkConfig, "sinks[0]"))

    async def main() -> None:
        await sink.open()
        await sink.close()

    trio.run(main)


def start_live_writer(directory: Path, count: int) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen(
        [sys.executable, str(HELPERS / "live_writer_child.py"), str(directory), str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def test_next_run_seals_a_killed_writers_tmp_but_never_a_live_ones(tmp_path: Path) -> None:
    child, temp = start_live_writer(tmp_path, 30)
    try:
        assert temp.exists() and temp.name.endswith(".msgpack.zst.tmp")
        open_file_sink(tmp_path)  # another run on the same directory while the writer lives
        assert temp.exists()  # left alone: its writer holds it
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    open_file_sink(tmp_path)  # the next run after the kill
    final = temp.with_name(temp.name.removesuffix(".tmp"))
    assert not temp.exists() and final.exists()
    batches, damage = read_all(final)
    assert batches == [batch_bytes(seq, 20, kinds=True) for seq in range(30)] and damage == []


def test_repair_seals_cuts_torn_tails_and_reports_corruption(tmp_path: Path) -> None:
    child, temp = start_live_writer(tmp_path, 12)
    held = cli("repair", str(tmp_path))
    assert held.returncode == 0 and f"left {temp.name}: a live writer holds it" in held.stdout
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    os.truncate(temp, temp.stat().st_size - 7)  # a kill in the middle of a write
    final = temp.with_name(temp.name.removesuffix(".tmp"))

    dry = cli("repair", "--dry-run", str(tmp_path))
    assert dry.returncode == 0 and "would seal" in dry.stdout and temp.exists()
    done = cli("repair", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"seal {temp.name}" in done.stdout and f"cut {final.name}: torn tail" in done.stdout
    batches, damage = read_all(final)
    assert batches == [batch_bytes(seq, 20, kinds=True) for seq in range(11)] and damage == []
    assert cli("repair", str(tmp_path)).stdout.strip() == f"{tmp_path}: nothing to repair"

    data = bytearray(final.read_bytes())
    data[len(data) // 2] ^= 0x04
    final.write_bytes(data)
    corrupt = cli("repair", str(tmp_path))
    assert corrupt.returncode == 1 and final.read_bytes() == data  # reported, left for investigation
    (line,) = corrupt.stderr.splitlines()
    assert line.startswith(f"cuptistream: {final}: ") and "left in place, readers skip it" in line
    assert cli("repair", str(tmp_path / "missing")).stderr.startswith("cuptistream: ")


def test_reader_keeps_reading_a_file_it_cannot_open(tmp_path: Path) -> None:
    write_recording(tmp_path / "a.msgpack.zst", range(2))
    (tmp_path / "b.msgpack.zst").mkdir()  # not a file: skipped by the listing
    os.symlink(tmp_path / "missing", tmp_path / "c.msgpack.zst")  # a dangling link: not a file either
    write_recording(tmp_path / "d.msgpack.zst", range(2, 4))
    files = sorted(tmp_path.glob("*.msgpack.zst"))
    reader = Reader(files)  # as if listed before b and c changed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [b.seq for b in reader.batches()] == [0, 1, 2, 3]
    assert [Path(d.path).name for d in reader.damage] == ["b.msgpack.zst", "c.msgpack.zst"]
    assert all(d.problem.startswith("cannot read") for d in reader.damage)


def test_summary_over_bombs_stays_in_bounded_memory(tmp_path: Path) -> None:
    """The views (summary, export, plot) read frames the same way: a 4 GiB bomb next to a good file
    is reported and skipped, and the summary process stays far below the bomb's size."""
    (tmp_path / "a-bomb.msgpack.zst").write_bytes(rle_frame(4 << 30, declare=False))
    write_recording(tmp_path / "b-good.msgpack.zst", range(5))
    measure = (  # VmHWM: peak RSS since exec (ru_maxrss would keep the forking pytest's)
        "import sys; from cuptistream.cli import main; from helpers.read_child import peak_rss_kib; "
        "code = main(sys.argv[1:]); print('peak_rss_kib', peak_rss_kib(), file=sys.stderr); sys.exit(code)"
    )
    child = subprocess.run(
        [sys.executable, "-c", measure, "summary", str(tmp_path), "--format", "json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(HELPERS.parent)},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout)["kernels"]["rows"]  # the good file's kernels are summarized
    lines = child.stderr.splitlines()
    assert any("a-bomb.msgpack.zst" in line and "decompresses to more than" in line for line in lines)
    rss_mib = int(lines[-1].split()[-1]) / 1024
    assert rss_mib < 400, (rss_mib, child.stderr)


def test_a_cleared_checksum_flag_cannot_smuggle_a_changed_frame_through() -> None:
    """Found by the nightly fuzz run: one flip clears a frame's checksum flag (it then reads like a
    frame from before checksums), a second changes its data. The 4 checksum bytes left behind give
    it away: the frame is reported, never returned changed."""
    encoder = FrameEncoder()
    good = encoder.frame(b"\x00\x00\x00\x00\x00")
    frame = bytearray(encoder.frame(b"\x00\x00\x00"))
    frame[4] &= ~0x04  # Content_Checksum_flag
    frame[-5] ^= 0x01  # the last byte of the raw block
    for data in (good + bytes(frame), bytes(frame), bytes(frame) + good):
        found = list(scan_frames(data))
        assert all(isinstance(item, Damage) or item.payload == b"\x00" * 5 for item in found), found
        assert any(isinstance(item, Damage) and item.problem.startswith("corrupt frame") for item in found)


def test_a_batch_in_pieces_is_framed_as_its_joined_bytes_would_be(tmp_path: Path) -> None:
    """The lane hands the file sink a batch's header and chunk payloads as they lie; the frame
    they make must be the one the joined bytes make: one checked frame with its content size,
    read back whole by the tolerant reader."""
    data = batch_bytes(3, 500)
    pieces = [data[:7], memoryview(data)[7:1000], b"", memoryview(data)[1000:]]
    encoder = FrameEncoder(level=3)
    framed = encoder.frame(pieces)
    assert zstandard.get_frame_parameters(framed).content_size == len(data)
    assert zstandard.get_frame_parameters(framed).has_checksum
    assert zstandard.ZstdDecompressor().decompress(framed) == data
    writer = SegmentWriter(tmp_path, prefix="p", suffix=".msgpack.zst", rotate_age=0, zstd_level=3)
    writer.append(pieces)
    writer.append(data)
    writer.close()
    frames = [item for path in sorted(tmp_path.iterdir()) for item in scan_frames(path.read_bytes())]
    assert [f.payload for f in frames if isinstance(f, Frame)] == [data, data]
