"""CubinArchive: each cubin written once, by CRC, to real files."""

from __future__ import annotations

import ctypes
from pathlib import Path

from cuptistream.cupti.cubin_archive import CubinArchive

FIXTURE = Path(__file__).parent / "fixtures" / "sampling" / "kernels_b_h200.cubin"


def _in_memory(blob: bytes) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(blob, len(blob))  # stands where the module callback's pCubin points


def test_each_crc_is_written_once_with_the_bytes_it_had_at_load(tmp_path: Path) -> None:
    blob = FIXTURE.read_bytes()
    memory = _in_memory(blob)
    archive = CubinArchive(str(tmp_path / "cubins"))
    archive.keep(0x1463, ctypes.addressof(memory), len(blob))
    memory[0:4] = b"XXXX"  # the module is gone; what was copied at load stays
    archive.keep(0x1463, ctypes.addressof(memory), len(blob))  # a second load of the same cubin
    archive.keep(0, ctypes.addressof(memory), len(blob))  # no CRC: nothing to name it by
    assert not (tmp_path / "cubins").exists()  # nothing written inside the callback
    archive.write()
    files = sorted((tmp_path / "cubins").iterdir())
    assert [f.name for f in files] == ["0000000000001463.cubin"]
    assert files[0].read_bytes() == blob
    archive.write()  # nothing pending: nothing rewritten
    assert sorted((tmp_path / "cubins").iterdir()) == files


def test_without_a_directory_nothing_is_kept(tmp_path: Path) -> None:
    memory = _in_memory(b"\x7fELF")
    archive = CubinArchive(None)
    archive.keep(7, ctypes.addressof(memory), 4)
    archive.write()
    assert list(tmp_path.iterdir()) == []
