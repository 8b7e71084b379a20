"""Hand-made zstd frames for the recording tests: decompression bombs built from RLE blocks (each
4 bytes on disk, 128 KiB decompressed), with or without a declared content size, as a hostile
writer would make them. Built from the frame format (RFC 8878), not with a compressor."""

from __future__ import annotations

MAGIC = b"\x28\xb5\x2f\xfd"
BLOCK = 128 * 1024


def rle_frame(content_bytes: int, *, declare: bool, fill: bytes = b"\0") -> bytes:
    """A frame whose ``content_bytes`` of ``fill`` are RLE blocks; ``declare`` writes the 8-byte
    content size (Frame_Content_Size_flag 3), otherwise the size is unknown until decompressed."""
    descriptor = 0xC0 if declare else 0x00  # no single segment, no checksum, no dictionary
    window = bytes([7 << 3])  # 2**(10 + 7) bytes = one block
    header = MAGIC + bytes([descriptor]) + window
    if declare:
        header += content_bytes.to_bytes(8, "little")
    blocks = []
    left = content_bytes
    while True:
        size = min(BLOCK, left)
        left -= size
        last = int(left == 0)
        blocks.append(((size << 3) | (1 << 1) | last).to_bytes(3, "little") + fill)
        if last:
            return header + b"".join(blocks)
