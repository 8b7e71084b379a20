"""Bytes per event and zstd time per event: the events' map encoding against an array-like one (issue 30).

    python bench/bytes_per_event.py [CAPTURE]   # default: W3's own 4 MiB buffers from the H100

Decodes a capture as the collector does (``Decoder.decode_packed``: the events' own msgpack maps, the
file sink's payload) and as Structs re-encoded as arrays (``[tag, field, ...]``, the field names
left out), then times zstd levels 1 and 3 over each (process CPU time, the mean of 5 passes). A
measurement for a format decision; nothing in the product encodes arrays.
"""

import sys
import time

import msgspec
import zstandard

from cuptistream.cupti import capture, records
from cuptistream.cupti.decode import Decoder
from cuptistream.cupti.names import TableNames

W3 = "bench/results/2026-11-27f-h100/gpu-capture-stream/w3_stream.cupti"


def main() -> None:
    cap = capture.read(sys.argv[1] if len(sys.argv) > 1 else W3)
    buffers = [memoryview(bytes(buf.data)) for buf in cap.buffers]
    packed = Decoder(TableNames(cap.strings), records.RecordLayouts(dict(cap.struct_sizes)))
    payload, count = bytearray(), 0
    for data in buffers:
        for chunk in packed.decode_packed(data, len(data)):
            payload += bytes(chunk.payload)
            count += chunk.count
    structs = Decoder(TableNames(cap.strings), records.RecordLayouts(dict(cap.struct_sizes)))
    events = [e for data in buffers for e in structs.decode(data, len(data))]
    encode = msgspec.msgpack.Encoder().encode
    array = b"".join(encode((type(e).__struct_config__.tag, *msgspec.structs.astuple(e))) for e in events)
    print(f"{count} events ({sorted({type(e).__name__ for e in events})})")
    print(f"map encoding: {len(payload) / count:.0f} bytes/event; array-like: {len(array) / len(events):.0f}")
    for level in (1, 3):
        compressor = zstandard.ZstdCompressor(level=level)
        for name, data in (("map", bytes(payload)), ("array", array)):
            start = time.process_time()
            for _ in range(5):
                out = compressor.compress(data)
            seconds = (time.process_time() - start) / 5
            print(
                f"zstd {level} {name}: {seconds / count * 1e9:.0f} ns/event, ratio {len(data) / len(out):.0f}, "
                f"{len(out) / count:.1f} bytes/event compressed"
            )


if __name__ == "__main__":
    main()
