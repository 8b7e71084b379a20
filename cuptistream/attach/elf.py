"""The address of an exported function in another process: its ELF file's dynamic symbol table and
where ``/proc/PID/maps`` says the file is mapped. Standard library only; ELF64 little-endian."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SHT_DYNSYM = 11
_PT_LOAD = 1
_SHN_UNDEF = 0
_PAGE = 4096


class ElfError(ValueError):
    """Not an ELF64 file we can read symbols from."""


@dataclass(frozen=True)
class Mapping:
    start: int
    offset: int
    path: str  # as the target sees it


def mappings(pid: int) -> list[Mapping]:
    """The file-backed mappings of ``pid``. Raises ``OSError``."""
    found = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                start = int(fields[0].split("-")[0], 16)
                found.append(Mapping(start, int(fields[2], 16), fields[5].rstrip("\n")))
    return found


def base_address(pid: int, path: str) -> int | None:
    """Where ``path`` starts in ``pid``'s memory (its mapping at file offset 0), or None."""
    starts = [m.start for m in mappings(pid) if m.path == path and m.offset == 0]
    return min(starts) if starts else None


def readable_path(pid: int, path: str) -> str:
    """``path`` as seen from here: through ``/proc/PID/root`` (another mount namespace, a container)."""
    return f"/proc/{pid}/root{path}"


def dynamic_symbols(path: str, names: set[str]) -> dict[str, int]:
    """The defined dynamic symbols among ``names`` in the ELF file ``path``, relative to its first
    loadable segment (add the file's base address). Raises ``ElfError`` or ``OSError``."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for n in range(phnum):
        p_type, _, _, p_vaddr = struct.unpack_from("<IIQQ", data, phoff + n * phentsize)
        if p_type == _PT_LOAD:
            loads.append(p_vaddr)
    if not loads:
        raise ElfError(f"{path} has no loadable segment")
    first = min(loads) & ~(_PAGE - 1)
    found: dict[str, int] = {}
    for n in range(shnum):
        header = shoff + n * shentsize
        sh_type = struct.unpack_from("<I", data, header + 4)[0]
        if sh_type != _SHT_DYNSYM:
            continue
        sh_offset, sh_size, sh_link = (
            *struct.unpack_from("<QQ", data, header + 0x18),
            struct.unpack_from("<I", data, header + 0x28)[0],
        )
        sh_entsize = struct.unpack_from("<Q", data, header + 0x38)[0] or 24
        strtab = struct.unpack_from("<Q", data, shoff + sh_link * shentsize + 0x18)[0]
        for offset in range(sh_offset, sh_offset + sh_size, sh_entsize):
            st_name, _, _, st_shndx, st_value = struct.unpack_from("<IBBHQ", data, offset)
            if st_shndx == _SHN_UNDEF or not st_value:
                continue
            end = data.index(b"\0", strtab + st_name)
            name = data[strtab + st_name : end].decode("ascii", "replace")
            if name in names and name not in found:
                found[name] = st_value - first
    return found


def find_symbols(pid: int, names: set[str], paths: list[str]) -> dict[str, int]:
    """Absolute addresses in ``pid`` of ``names``, looked up in the mapped files ``paths`` in turn
    (the first file that defines a name wins). Files that cannot be read are skipped."""
    found: dict[str, int] = {}
    for path in paths:
        missing = names - set(found)
        if not missing:
            break
        base = base_address(pid, path)
        if base is None:
            continue
        try:
            relative = dynamic_symbols(readable_path(pid, path), missing)
        except (OSError, ElfError, struct.error, ValueError):
            continue
        found.update({name: base + value for name, value in relative.items()})
    return found
