"""The public reader: every complete frame after a SIGKILL, torn tails reported, foreign files refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import zstandard
from helpers.batchgen import batch_bytes, outgoing

from cuptistream.errors import UserError
from cuptistream.recording import jsonl
from cuptistream.recording.codec import decode_batch, encode_batch_object
from cuptistream.recording.reader import TornTailError, TornTailWarning, read
from cuptistream.recording.segments import SegmentWriter

CHILD = Path(__file__).parent / "helpers" / "segment_writer_child.py"


def test_kill_9_mid_stream_keeps_every_flushed_frame(tmp_path: Path) -> None:
    """A real child writes batches until SIGKILL. Every batch it reported as written is read back
    exactly; the writer's live ``.tmp`` file is read too."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path), "20000"],  # ~20 kB segments: several files
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    last = -1
    try:
        for line in child.stdout:  # wait until it has written a good number of batches
            last = int(line)
            if last >= 150:
                break
        child.send_signal(signal.SIGKILL)
        for line in child.stdout.read().split():  # the lines it printed before dying
            last = int(line)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    reported = last + 1  # batches 0..last were written before their line was printed

    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) > 3 and all(n.endswith((".msgpack.zst", ".msgpack.zst.tmp")) for n in names)
    # Usually killed with a live .tmp file; none if the kill fell between a rotation and the next open.
    assert sum(n.endswith(".tmp") for n in names) <= 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = read(tmp_path)
        batches = [encode_batch_object(b) for b in reader.batches()]
    torn = [w for w in caught if issubclass(w.category, TornTailWarning)]
    assert len(torn) == len(reader.torn_tails)  # any torn tail is reported, never dropped silently
    # A frame may have been written after the last line was printed, never fewer than reported.
    assert len(batches) in (reported, reported + 1)
    assert batches == [batch_bytes(seq, 50, kinds=True) for seq in range(len(batches))]

    # Now cut the last file mid-frame, as a kill during a large write would leave it.
    live = tmp_path / names[-1]
    os.truncate(live, live.stat().st_size - 7)
    with pytest.warns(TornTailWarning, match=r"torn tail of \d+ bytes at offset \d+"):
        reader = read(tmp_path)
        recovered = [encode_batch_object(b) for b in reader.batches()]
    assert len(recovered) == len(batches) - 1  # only the cut frame is gone
    assert recovered == batches[:-1]
    (tail,) = reader.torn_tails
    assert tail.path == str(live) and tail.offset + tail.length == live.stat().st_size
    with pytest.raises(TornTailError, match="torn tail"):
        list(read(tmp_path, strict=True))


def test_torn_tail_in_a_jsonl_file(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    parts = [jsonl.encode_batch(outgoing(seq, 20, kinds=True).batch) for seq in range(3)]
    data = b"".join(parts)
    # Cut inside the last line, then at a line boundary inside the last batch: both are torn.
    for cut in (len(data) - 5, data.rstrip(b"\n").rfind(b"\n") + 1):
        path.write_bytes(data[:cut])
        with pytest.warns(TornTailWarning):
            reader = read(path)
            seqs = [b.seq for b in reader.batches()]
        assert seqs == [0, 1]
        (tail,) = reader.torn_tails
        assert tail.offset == len(
            b"".join(jsonl.encode_batch(outgoing(s, 20, kinds=True).batch) for s in (0, 1))
        )
        assert tail.length == cut - tail.offset


def test_jsonl_layout_is_an_envelope_then_one_line_per_event() -> None:
    import json

    batch = outgoing(7, 4, kinds=True).batch
    lines = jsonl.encode_batch(batch).decode().splitlines()
    envelope = json.loads(lines[0])
    assert envelope["type"] == "batch" and envelope["seq"] == 7 and envelope["event_count"] == 4
    assert set(envelope) >= {"schema_version", "session_id", "resource", "attributes", "clock"}
    assert [json.loads(line)["type"] for line in lines[1:]] == [e.__struct_config__.tag for e in batch.events]
    assert list(jsonl.iter_batches(jsonl.encode_batch(batch))) == [batch]


def test_files_that_are_not_ours_give_one_line_user_errors(tmp_path: Path) -> None:
    envelope = jsonl.encode_batch(outgoing(0, 0).batch)
    cases = {
        "notes.txt": b"hello",
        "a.msgpack.zst": b"definitely not zstd",
        "b.msgpack.zst": zstandard.ZstdCompressor().compress(b"\x01\x02 not msgpack of a batch"),
        "c.jsonl": b'{"hello": "world"}\n',
        "d.jsonl.zst": zstandard.ZstdCompressor().compress(b"[1, 2, 3]\n"),
        "e.jsonl": envelope.replace(b'"event_count":0', b'"event_count":1') + b"\n",  # blank "event"
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError) as caught:
            list(read(tmp_path / name))
        message = str(caught.value)
        assert message.startswith(str(tmp_path / name)) and "\n" not in message, message
        assert "cuptistream" in message
    with pytest.raises(UserError, match="no such file"):
        read(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no cuptistream files here"):
        read(empty)


def test_directory_reads_all_formats_in_name_order_and_skips_other_files(tmp_path: Path) -> None:
    for index, (suffix, level) in enumerate([(".msgpack.zst", 3), (".jsonl.zst", 3), (".jsonl", None)]):
        writer = SegmentWriter(tmp_path, prefix=f"p{index}", suffix=suffix, rotate_age=0, zstd_level=level)
        for seq in range(index * 2, index * 2 + 2):
            batch = outgoing(seq, 10, kinds=True)
            writer.append(batch.data if suffix == ".msgpack.zst" else jsonl.encode_batch(batch.batch))
        if index != 1:
            writer.close()  # the jsonl.zst writer stays "live": its .tmp is read too
    (tmp_path / "README").write_text("not ours, not read")
    reader = read(tmp_path)
    assert [b.seq for b in reader.batches()] == [0, 1, 2, 3, 4, 5]
    assert [p.name.split("-")[0] for p in reader.files] == ["p0", "p1", "p2"]
    assert reader.files[1].name.endswith(".jsonl.zst.tmp")
    events = list(reader)
    assert len(events) == 60
    assert events[:10] == decode_batch(batch_bytes(0, 10, kinds=True)).events
