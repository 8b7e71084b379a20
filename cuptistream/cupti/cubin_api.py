"""CUPTI's cubin utilities (declared in ``cupti_pcsampling.h``), which cupti-python does
not bind: a cubin's CRC (``cuptiGetCubinCrc``, the key PC sampling records and module events share)
and SASS-to-source lines (``cuptiGetSassToSourceCorrelation``).

Layouts follow the header field for field; calls go through ``cupti.library``. Neither needs a GPU,
but SASS-to-source needs the NVIDIA driver library: without libcuda it fails with
``CUPTI_ERROR_UNKNOWN``.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_char_p, c_size_t, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass

from cuptistream.cupti.library import call, libc_free, params_size


class GetCubinCrcParams(Structure):
    _fields_ = [("size", c_size_t), ("cubinSize", c_size_t), ("cubin", c_void_p), ("cubinCrc", c_uint64)]


class GetSassToSourceCorrelationParams(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("cubin", c_void_p),
        ("functionName", c_char_p),
        ("cubinSize", c_size_t),
        ("lineNumber", c_uint32),
        ("pcOffset", c_uint64),
        ("fileName", c_void_p),  # char*, malloc'ed by CUPTI: the caller frees it
        ("dirName", c_void_p),
    ]


def cubin_crc(cubin: bytes) -> int:
    """CUPTI's CRC of a cubin: the key PC records and module events share."""
    buffer = ctypes.create_string_buffer(cubin, len(cubin))
    return cubin_crc_at(ctypes.addressof(buffer), len(cubin))


def cubin_crc_at(address: int, size: int) -> int:
    """``cubin_crc`` of the ``size`` bytes at ``address`` (e.g. a module callback's ``pCubin``)."""
    params = GetCubinCrcParams(size=params_size(GetCubinCrcParams, "cubinCrc"), cubinSize=size, cubin=address)
    call("cuptiGetCubinCrc", params)
    return int(params.cubinCrc)


@dataclass(frozen=True)
class SourceLine:
    file: str
    directory: str
    line: int


class CubinLines:
    """SASS-to-source lookups in one cubin (``cuptiGetSassToSourceCorrelation``, guide §2.10.5).

    The cubin needs line info (nvcc or NVRTC ``-lineinfo``).
    """

    def __init__(self, cubin: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(cubin, len(cubin))  # one copy, kept for every lookup
        self._size = len(cubin)

    def line(self, function: str, pc_offset: int) -> SourceLine | None:
        """Where ``pc_offset`` of ``function`` comes from; None without line info for it. Raises
        ``CuptiError`` when CUPTI fails (``ERROR_UNKNOWN`` also means "function not in this cubin")."""
        params = GetSassToSourceCorrelationParams(
            size=params_size(GetSassToSourceCorrelationParams, "dirName"),
            cubin=ctypes.addressof(self._buffer),
            functionName=function.encode(),
            cubinSize=self._size,
            pcOffset=pc_offset,
        )
        call("cuptiGetSassToSourceCorrelation", params)
        try:
            if not params.fileName or not params.lineNumber:
                return None
            directory = ctypes.string_at(params.dirName).decode(errors="replace") if params.dirName else ""
            file = ctypes.string_at(params.fileName).decode(errors="replace")
            return SourceLine(file, directory, int(params.lineNumber))
        finally:  # CUPTI mallocs both strings for the caller to free
            for pointer in (params.fileName, params.dirName):
                if pointer:
                    libc_free(pointer)
