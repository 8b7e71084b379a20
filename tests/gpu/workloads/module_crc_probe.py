"""Why does the CRC of a module callback's cubin differ from the PC records' CRC? (GPU machine only)

``python tests/gpu/workloads/module_crc_probe.py`` loads an NVRTC cubin twice (unloading between),
and in the module-loaded / unload-starting callbacks copies the ``pCubin`` bytes. It prints one JSON
line: per callback, the size, whether the bytes equal the cubin we loaded, the first differing
offset and count of differing bytes, and CUPTI's CRC of the bytes (in the callback and of the copy).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sampling_common import KERNELS, Cuda, compile_cubin

from cuptistream.cupti import cubin_api, subscriber
from cuptistream.cupti.contexts import MODULE_LOADED, MODULE_UNLOAD_STARTING, module_data


def main() -> None:
    cuda = Cuda(0)
    cubin = compile_cubin(KERNELS, cuda.arch())
    seen: list[dict[str, Any]] = []

    def on_module(domain: int, cbid: int, data: Any) -> None:
        module_id, size, address = module_data(int(data.resource_descriptor))
        copy = ctypes.string_at(address, size) if address and size else b""
        diff = [i for i in range(min(len(copy), len(cubin))) if copy[i] != cubin[i]]
        seen.append({
            "cbid": cbid, "module_id": module_id, "size": size,
            "equal": copy == cubin, "first_diff": diff[0] if diff else None, "diff_bytes": len(diff),
            "crc_in_callback": cubin_api.cubin_crc_at(address, size) if address else 0,
            "crc_of_copy": cubin_api.cubin_crc(copy) if copy else 0,
            "elf_magic": copy[:4].hex(),
        })  # fmt: skip

    regs = [
        subscriber.register(subscriber.Domain.RESOURCE, on_module, cbid=c)
        for c in (MODULE_LOADED, MODULE_UNLOAD_STARTING)
    ]
    for _ in range(2):
        cuda.unload(cuda.load(cubin))
    for reg in regs:
        reg.remove()
    print(
        json.dumps(
            {
                "ours": {"size": len(cubin), "crc": cubin_api.cubin_crc(cubin), "magic": cubin[:4].hex()},
                "callbacks": seen,
            }
        )
    )


if __name__ == "__main__":
    main()
