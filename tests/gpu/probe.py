"""Print what this machine's CUPTI writes (version, record sizes, chosen layouts, kinds that enable).

python -m tests.gpu.probe
"""

from __future__ import annotations

import ctypes

from cuptistream.cupti import driver, gpus, kind_support, kinds, library
from cuptistream.cupti.records import choose_dtype


def main() -> None:
    driver.require_gpu()
    print("device", gpus.device_name(0), "cupti", driver.cupti_version(), "lib", library.libcupti()._name)
    for info in kind_support.list_kinds():
        print(
            f"  {info.name:30} kind={info.kind:2} record={info.record or '?':24} size={info.record_size:4} "
            f"supported={info.supported} {info.note}"
        )
    missing = [
        s.name
        for s in kinds.KINDS.values()
        if driver.struct_size(s.kind) and not choose_dtype(s.kind, driver.struct_size(s.kind) or 0)
    ]
    print("kinds with a size but no matching dtype:", missing)
    print("timestamp", driver.timestamp())
    print("ctypes ok", ctypes.sizeof(ctypes.c_size_t))


if __name__ == "__main__":
    main()
