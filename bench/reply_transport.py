"""What a decode worker's reply costs to move, and what shared reply slots would save.

    taskset -c 1 python bench/reply_transport.py [--rounds 5] [--passes 6]

A decode worker packs a buffer's events (W3's 4 MiB buffers: ~7 MB of msgpack each) and sends them
to its probe connection in the collector as SOCK_SEQPACKET fragments (``worker_protocol``): the
kernel copies them out of the worker and into the collector's reply mapping. Issue 30's profiles
put sending and receiving replies at ~15 % of the samples at 16 GPU programs. Here a forked worker
sends the real payloads (``Decoder.decode_packed`` of W3's buffers) to this process, which then
compresses them as the file sink would (zstd level 1, one frame per batch: the same work in every
path, so that reading a shared mapping's pages is charged too). Paths, interleaved per round:

- ``socket``: today's ``send_reply`` / ``receive_reply`` into a reused ``ReplyMaps`` mapping.
- ``slot``: the worker copies the payloads into a shared memfd slot (two slots, each mapped once
  by both sides and reused, as a reverse ``SlotPool`` would be) and sends only the header.
- ``slot-in-place``: the same without the worker's copy, the bound for packing straight into the
  slot (the packer writes its output buffer once either way).

Per path: the worker's and the collector's CPU time (``getrusage``) per event, median [min .. max]
over rounds, their sum, and the sum against the socket's of the same round.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import socket
import statistics
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cuptistream.collector import worker_protocol as wp  # noqa: E402
from cuptistream.collector.buffer_decoder import Decoder  # noqa: E402
from cuptistream.collector.reply_maps import ReplyMaps  # noqa: E402
from cuptistream.cupti import capture  # noqa: E402
from cuptistream.cupti.names import TableNames  # noqa: E402
from cuptistream.cupti.records import RecordLayouts  # noqa: E402
from cuptistream.recording.codec import array_header  # noqa: E402
from cuptistream.recording.framing import FrameEncoder  # noqa: E402

W3 = ROOT / "bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"
PATHS = ("socket", "slot", "slot-in-place")
SLOT_BYTES = 16 << 20
HEADER = struct.Struct("<II")  # slot, chunks; then (size, count) per chunk
PAIR = struct.Struct("<QQ")


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def replies() -> list[list[tuple[bytes, int]]]:
    """Per W3 buffer, its packed chunks as (payload, events)."""
    cap = capture.read(W3)
    decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)))
    out = []
    for buffer in cap.buffers:
        view = memoryview(bytearray(buffer.data))
        out.append([(bytes(c.payload), c.count) for c in decoder.decode_packed(view, len(view))])
    return out


def worker(sock: socket.socket, data: list[list[tuple[bytes, int]]], slots: list[mmap.mmap]) -> None:
    """Serve ``(path, passes)`` requests until end of stream; answer each run with its CPU time."""
    turn = 0
    while True:
        request = sock.recv(64)
        if not request:
            return
        path, passes = request.decode().split()
        start = cpu()
        for _ in range(int(passes)):
            for chunks in data:
                if path == "socket":
                    calls: list[wp.Call] = [wp.EmitChunk(memoryview(p), n, n) for p, n in chunks]
                    wp.send_reply(sock, wp.Reply(calls=calls))
                else:
                    slot = turn % len(slots)
                    turn += 1
                    at = 0
                    for payload, _ in chunks:
                        if path == "slot":
                            slots[slot][at : at + len(payload)] = payload
                        at += len(payload)
                    pairs = b"".join(PAIR.pack(len(p), n) for p, n in chunks)
                    sock.send(HEADER.pack(slot, len(chunks)) + pairs)
                sock.recv(1)  # the collector is done with it (the slot is free again)
        sock.send(str(cpu() - start).encode())


def collect(
    sock: socket.socket, path: str, passes: int, buffers: int, slots: list[mmap.mmap], maps: ReplyMaps
) -> float:
    """This side of one run: receive every reply and compress its batch; this process's CPU."""
    encoder = FrameEncoder(level=1)
    start = cpu()
    reply: wp.Reply | None = None
    payloads: list[memoryview] | None = None
    for _ in range(passes * buffers):
        if path == "socket":
            reply = wp.receive_reply(sock, maps)
            assert reply is not None
            payloads = [c.payload for c in reply.calls if isinstance(c, wp.EmitChunk)]
            counts = [c.count for c in reply.calls if isinstance(c, wp.EmitChunk)]
        else:
            message = sock.recv(1 << 16)
            slot, chunks = HEADER.unpack_from(message)
            view, at, payloads, counts = memoryview(slots[slot]), 0, [], []
            for i in range(chunks):
                size, count = PAIR.unpack_from(message, HEADER.size + i * PAIR.size)
                payloads.append(view[at : at + size])
                counts.append(count)
                at += size
        for payload, count in zip(payloads, counts, strict=True):
            encoder.frame([array_header(count), payload])
        reply = payloads = None  # let go of the views, so the reply's mapping is reused
        sock.send(b"k")
    return cpu() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=6, help="passes over W3's buffers per path and round")
    args = parser.parse_args()
    data = replies()
    events = sum(n for chunks in data for _, n in chunks)
    nbytes = sum(len(p) for chunks in data for p, _ in chunks)
    assert max(sum(len(p) for p, _ in chunks) for chunks in data) <= SLOT_BYTES
    fds = [os.memfd_create(f"reply-slot-{i}") for i in range(2)]
    for fd in fds:
        os.ftruncate(fd, SLOT_BYTES)
    slots = [mmap.mmap(fd, SLOT_BYTES) for fd in fds]  # shared: the fork keeps the same pages
    for slot in slots:
        slot[:] = bytes(SLOT_BYTES)  # fault both sides' pages in once, as a long-lived pool would be
    ours, theirs = wp.pair()
    child = os.fork()
    if child == 0:
        ours.close()
        worker(theirs, data, slots)
        os._exit(0)
    theirs.close()
    spent: dict[str, list[tuple[float, float]]] = {path: [] for path in PATHS}
    maps = ReplyMaps(64 << 20)  # kept across runs: replies land in mappings already faulted in
    for round_ in range(args.rounds):
        for path in PATHS if round_ % 2 == 0 else tuple(reversed(PATHS)):
            ours.send(f"{path} {args.passes}".encode())
            mine = collect(ours, path, args.passes, len(data), slots, maps)
            theirs_cpu = float(ours.recv(64).decode())
            per = 1e9 / (events * args.passes)
            spent[path].append((theirs_cpu * per, mine * per))
    ours.close()
    os.waitpid(child, 0)
    assert maps.created <= len(data), f"replies landed in {maps.created} fresh mappings"  # one per size
    print(f"W3: {len(data)} buffers, {events} events, {nbytes / events:.0f} bytes an event; "
          f"{args.rounds} rounds of {args.passes} passes; ns per event, median [min .. max]")  # fmt: skip
    print(f"  {'path':14} {'worker':>22} {'collector (+ zstd)':>22} {'both':>22} {'both / socket':>22}")
    for path, rows in spent.items():
        cells = []
        for values in ([w for w, _ in rows], [c for _, c in rows], [w + c for w, c in rows]):
            cells.append(f"{statistics.median(values):6.0f} [{min(values):.0f} .. {max(values):.0f}]")
        ratios = [(w + c) / (sw + sc) for (w, c), (sw, sc) in zip(rows, spent["socket"], strict=True)]
        cells.append(f"{statistics.median(ratios):.2f} [{min(ratios):.2f} .. {max(ratios):.2f}]")
        print(f"  {path:14} " + " ".join(f"{cell:>22}" for cell in cells))


if __name__ == "__main__":
    main()
