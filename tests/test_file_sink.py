"""The file sink and the segment writer, on real files in a temporary directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio
from helpers.batchgen import batch_bytes, outgoing, run_sink

from cuptistream.config import convert
from cuptistream.errors import ConfigError, SinkUnavailableError
from cuptistream.plugin import DeliveryError, OutgoingBatch
from cuptistream.recording import segments
from cuptistream.recording.codec import decode_batch, encode_batch_object
from cuptistream.recording.framing import iter_frames
from cuptistream.recording.reader import read
from cuptistream.recording.segments import SegmentWriter
from cuptistream.sinks.file import FileSink, FileSinkConfig


def make_config(**settings: object) -> FileSinkConfig:
    return convert({"type": "file", **settings}, FileSinkConfig, "sinks[0]")


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- round trip ---------------------------------------------------------------------------------


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
def test_million_events_round_trip_byte_exact(tmp_path: Path) -> None:
    per_batch, total = 8192, 1_000_000
    counts = [min(per_batch, total - start) for start in range(0, total, per_batch)]
    originals = [batch_bytes(seq, count) for seq, count in enumerate(counts)]
    sink = FileSink(make_config(directory=str(tmp_path), rotate_bytes="16MiB"))
    run_sink(
        sink,
        [OutgoingBatch(data, seq, n) for seq, (data, n) in enumerate(zip(originals, counts, strict=True))],
    )

    files = sorted(tmp_path.iterdir())
    assert len(files) > 1 and all(f.name.endswith(".msgpack.zst") for f in files)  # it rotated
    # The frames hold the pipeline's bytes exactly...
    frames = [frame for f in files for frame in iter_frames(f.read_bytes(), str(f))]
    assert frames == originals
    # ...and the reader's Batches re-encode to the same bytes.
    reader = read(tmp_path)
    reencoded = [encode_batch_object(batch) for batch in reader.batches()]
    assert reencoded == originals
    assert reader.torn_tails == []
    assert sum(len(decode_batch(b).events) for b in originals[:2]) == 2 * per_batch
    stats = sink.stats()
    assert stats["files_written"] == len(files)
    assert stats["bytes_written"] == sum(f.stat().st_size for f in files)
    assert stats["batches_written"] == len(originals)


def test_a_fast_zstd_level_writes_frames_the_reader_reads(tmp_path: Path) -> None:
    originals = [batch_bytes(seq, 2000) for seq in range(3)]
    batches = [OutgoingBatch(data, seq, 2000) for seq, data in enumerate(originals)]
    sizes = {}
    for level in (-3, 3):
        directory = tmp_path / f"level{level}"
        run_sink(FileSink(make_config(directory=str(directory), zstd_level=level)), batches)
        assert [encode_batch_object(batch) for batch in read(directory).batches()] == originals
        sizes[level] = sum(f.stat().st_size for f in directory.iterdir())
    assert sizes[-3] > sizes[3]  # the level took effect


@pytest.mark.parametrize(("fmt", "compression"), [("jsonl", "zstd"), ("jsonl", "none")])
def test_jsonl_reads_back_the_same_events_as_msgpack(tmp_path: Path, fmt: str, compression: str) -> None:
    batches = [outgoing(seq, 300, kinds=True) for seq in range(5)] + [outgoing(5, 0)]
    run_sink(FileSink(make_config(directory=str(tmp_path / "mp"))), batches)
    run_sink(
        FileSink(make_config(directory=str(tmp_path / "js"), format=fmt, compression=compression)), batches
    )
    suffix = ".jsonl.zst" if compression == "zstd" else ".jsonl"
    assert all(name.endswith(suffix) for name in names(tmp_path / "js"))
    from_msgpack = list(read(tmp_path / "mp").batches())
    from_jsonl = list(read(tmp_path / "js").batches())
    assert from_jsonl == from_msgpack == [b.batch for b in batches]
    assert len(list(read(tmp_path / "js"))) == 5 * 300


# --- rotation, names, modes, fsync ------------------------------------------------------------


def test_temp_name_while_open_final_name_after_close(tmp_path: Path) -> None:
    sink = FileSink(make_config(directory=str(tmp_path), prefix="run"))

    async def main() -> None:
        await sink.open()
        assert names(tmp_path) == []  # no empty file before the first batch
        await sink.write(outgoing(0, 10))
        (only,) = names(tmp_path)
        assert only.startswith("run-") and only.endswith(".msgpack.zst.tmp")
        await sink.close()
        assert names(tmp_path) == [only.removesuffix(".tmp")]

    trio.run(main)
    assert [b.seq for b in read(tmp_path).batches()] == [0]


def test_rotation_by_size_keeps_write_order(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, prefix="p", suffix=".msgpack.zst", rotate_bytes=4096, rotate_age=0)
    payloads: list[bytes] = []
    while len(segments.list_segments(tmp_path, "p", ".msgpack.zst")) < 3 or writer.temp_path is None:
        payloads.append(batch_bytes(len(payloads), 40, kinds=True))
        writer.append(payloads[-1])
    live = writer.temp_path
    assert live is not None and live.exists()
    finished = segments.list_segments(tmp_path, "p", ".msgpack.zst")
    assert len(finished) >= 3 and live not in finished
    assert all(f.stat().st_size >= 4096 for f in finished)  # each rotated once it reached the size
    writer.close()
    files = sorted(tmp_path.iterdir())
    assert not any(f.name.endswith(".tmp") for f in files)
    assert files == segments.list_segments(tmp_path, "p", ".msgpack.zst")  # name order is write order
    assert [frame for f in files for frame in iter_frames(f.read_bytes())] == payloads
    # Names follow {prefix}-{host}-{pid}-{start_unix_ms}-{index:06d}{suffix}
    stem = files[0].name.removesuffix(".msgpack.zst")
    prefix, _host, pid, start_ms, index = stem.split("-")
    assert (prefix, int(pid), index) == ("p", os.getpid(), "000000")
    assert abs(int(start_ms) / 1000 - files[0].stat().st_mtime) < 60


def test_rotation_by_age(tmp_path: Path) -> None:
    sink = FileSink(make_config(directory=str(tmp_path), rotate_age="200ms"))

    async def main() -> None:
        await sink.open()
        await sink.write(outgoing(0, 5))
        await sink.write(outgoing(1, 5))
        assert len(names(tmp_path)) == 1  # young file: both batches in it
        await trio.sleep(0.25)  # the age being tested, not synchronization
        await sink.write(outgoing(2, 5))
        first, second = names(tmp_path)
        assert not first.endswith(".tmp") and second.endswith(".tmp")
        await sink.close()

    trio.run(main)
    files = sorted(tmp_path.iterdir())
    assert [len(list(read(f).batches())) for f in files] == [2, 1]


@pytest.mark.parametrize(("mode", "umask", "expected"), [(None, 0, 0o600), ("0640", 0o077, 0o640)])
def test_file_mode_does_not_depend_on_umask(
    tmp_path: Path, mode: str | None, umask: int, expected: int
) -> None:
    settings = {"directory": str(tmp_path)} | ({"file_mode": mode} if mode else {})
    old = os.umask(umask)
    try:
        run_sink(FileSink(make_config(**settings)), [outgoing(0, 3)])
    finally:
        os.umask(old)
    (path,) = tmp_path.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == expected


# 4 appends and 2 renames; each rename fsyncs the file and then the directory.
@pytest.mark.parametrize(("policy", "expected"), [("never", 0), ("batch", 4 + 2 * 2), ("rotate", 2 * 2)])
def test_fsync_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, expected: int) -> None:
    """Counts real fsync calls (the spy calls through): batch = each append plus before each rename;
    rotate = before each rename; both also fsync the directory after each rename."""
    calls: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(segments.os, "fsync", spy)
    writer = SegmentWriter(tmp_path, prefix="f", suffix=".msgpack.zst", rotate_age=0, fsync=policy)  # type: ignore[arg-type]
    for seq in range(3):
        writer.append(batch_bytes(seq, 5))
    writer.rotate()
    writer.append(batch_bytes(3, 5))
    writer.close()
    assert len(calls) == expected
    assert [b.seq for b in read(tmp_path).batches()] == [0, 1, 2, 3]


def test_failed_append_leaves_no_partial_frame(tmp_path: Path) -> None:
    """A write error mid-frame (here: the file size limit, a real EFBIG) must not leave bytes that
    would hide later frames from a reader."""
    import resource
    import signal

    writer = SegmentWriter(tmp_path, prefix="e", suffix=".msgpack.zst", rotate_bytes=0, rotate_age=0)
    first = batch_bytes(0, 20)
    writer.append(first)
    assert writer.temp_path is not None
    size = writer.temp_path.stat().st_size
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, old_limit[1]))
        with pytest.raises(OSError):
            writer.append(batch_bytes(1, 2000))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    writer.append(batch_bytes(2, 20))
    writer.close()
    assert [b.seq for b in read(tmp_path).batches()] == [0, 2]


def test_spool_helpers_list_seal_and_delete(tmp_path: Path) -> None:
    """What the Kafka sink's spool uses: finished segments in order, orphans sealed, deletes."""
    writer = SegmentWriter(tmp_path, prefix="spool", suffix=".msgpack.zst", rotate_bytes=1, rotate_age=0)
    for seq in range(3):
        writer.append(batch_bytes(seq, 2))  # rotate_bytes=1: one frame per segment
    crashed = SegmentWriter(tmp_path, prefix="spool", suffix=".msgpack.zst", rotate_age=0)
    crashed.append(batch_bytes(3, 2))  # never closed: its .tmp is an orphan
    orphan = crashed.temp_path
    assert orphan is not None
    finished = segments.list_segments(tmp_path, "spool", ".msgpack.zst")
    assert len(finished) == 3
    assert segments.list_segments(tmp_path, "spool", ".msgpack.zst", include_temp=True)[-1] == orphan
    assert segments.seal_orphans(tmp_path, "spool", ".msgpack.zst") == []  # its writer holds it
    os.close(crashed._fd)  # type: ignore[arg-type]  # what the kernel does when its process dies
    (sealed,) = segments.seal_orphans(tmp_path, "spool", ".msgpack.zst")
    assert sealed.name == orphan.name.removesuffix(".tmp") and not orphan.exists()
    segments.delete_segment(finished[0])
    segments.delete_segment(finished[0])  # already gone: fine
    left = segments.list_segments(tmp_path, "spool", ".msgpack.zst")
    assert [decode_batch(next(iter_frames(p.read_bytes()))).seq for p in left] == [1, 2, 3]  # type: ignore[arg-type]


# --- bad settings -------------------------------------------------------------------------------


def test_msgpack_without_compression_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(format="msgpack", compression="none")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("sinks[0]") and "compression" in message and "jsonl" in message


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"file_mode": "rw-r--r--"}, "file_mode"),
        ({"file_mode": 0o1777}, "file_mode"),
        ({"format": "parquet"}, "sinks[0].format"),
        ({"fsync": "always"}, "sinks[0].fsync"),
        ({"rotate_bytes": "lots"}, "sinks[0].rotate_bytes"),
        ({"zstd_level": 40}, "zstd_level"),
        ({"zstd_level": 0}, "zstd_level"),
        ({"zstd_level": -8}, "zstd_level"),
        ({"directry": "x"}, "sinks[0].directry"),
    ],
)
def test_other_bad_settings_name_their_key(settings: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(**settings)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_octal_string_file_mode_is_accepted() -> None:
    assert make_config(file_mode="0640").mode == 0o640
    assert make_config(file_mode=0o644).mode == 0o644
    assert make_config().suffix == ".msgpack.zst"


def test_unwritable_directory_is_one_line_sink_unavailable(tmp_path: Path) -> None:
    # Tests run as root here, so permission bits do not stop writes: a regular file in the
    # directory's path is an obstacle even root cannot write through.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sink = FileSink(make_config(directory=str(blocker / "out")))
    with pytest.raises(SinkUnavailableError) as caught:
        trio.run(sink.open)
    message = str(caught.value)
    assert "\n" not in message
    assert f"cannot write to {blocker / 'out'}" in message
    assert "Not a directory" in message and "choose another directory" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_directory_is_one_line_sink_unavailable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    sink = FileSink(make_config(directory=str(locked)))
    with pytest.raises(SinkUnavailableError, match="Permission denied; choose another directory"):
        trio.run(sink.open)


def test_write_after_close_is_a_delivery_error(tmp_path: Path) -> None:
    sink = FileSink(make_config(directory=str(tmp_path)))
    run_sink(sink, [outgoing(0, 1)])
    with pytest.raises(DeliveryError):
        trio.run(sink.write, outgoing(1, 1))


def test_each_process_gets_its_own_file_set_in_order(tmp_path: Path) -> None:
    # Batches of three processes (two ranks and the collector), interleaved as a collector sends them.
    import msgspec
    from helpers.batchgen import RESOURCE

    ranks = {
        pid: msgspec.structs.replace(RESOURCE, pid=pid, rank=rank, world_size=2)
        for rank, pid in enumerate((5001, 5002))
    }
    ranks[6000] = msgspec.structs.replace(RESOURCE, pid=6000, rank=None, job={})
    batches = []
    for seq in range(30):
        pid = (5001, 5002, 6000)[seq % 3]
        data = batch_bytes(seq, 20)
        batch = decode_batch(data)
        batch.resource = ranks[pid]
        data = encode_batch_object(batch)
        batches.append(OutgoingBatch(data, seq, 20, resource=ranks[pid]))
    run_sink(FileSink(make_config(directory=str(tmp_path), prefix="job")), batches)

    files = names(tmp_path)
    assert len(files) == 3
    assert [f.split("-")[1] for f in files] == ["rank0", "rank1", "testhost"]
    for name in files:
        read_back = list(read(tmp_path / name).batches())
        pids = {b.resource.pid for b in read_back}
        assert len(pids) == 1, f"{name} mixes processes {pids}"
        (pid,) = pids
        assert name.split("-")[-3] == str(pid)
        assert [b.seq for b in read_back] == [s for s in range(30) if (5001, 5002, 6000)[s % 3] == pid]


def test_process_writers_share_one_zstd_context(tmp_path: Path) -> None:
    # A zstd context per process would grow the collector by a few MiB per probe; writes come one
    # at a time, so the sink's writers share one (the test above reads each process's frames back).
    import msgspec
    from helpers.batchgen import RESOURCE

    sink = FileSink(make_config(directory=str(tmp_path)))
    sink._open()
    writers = [sink._writer_for(msgspec.structs.replace(RESOURCE, pid=pid)).writer for pid in (1, 2, 3)]
    assert len({id(w) for w in writers}) == 3
    assert len({id(w._encoder) for w in writers}) == 1 and writers[0]._encoder is not None
