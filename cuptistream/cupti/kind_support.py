"""Which activity kinds this machine's CUPTI can enable, and the record layout it writes for each:
the ``cuptistream kinds`` command.

Kept apart from ``kinds`` (the table of kinds, which the decoder reads): this asks CUPTI and the
decoder, so it sits above both.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuptistream.cupti import driver, library
from cuptistream.cupti.kinds import KINDS
from cuptistream.cupti.records import choose_dtype


@dataclass(frozen=True)
class KindInfo:
    """One row of ``cuptistream kinds``."""

    name: str
    kind: int
    event: str
    record: str  # the record struct CUPTI writes here, e.g. ``kernel11``; "" where unknown
    record_size: int  # bytes; 0 where unknown
    supported: bool  # whether CUPTI let us enable it on this device
    note: str = ""


def list_kinds() -> list[KindInfo]:
    """Every named kind, with the record layout CUPTI writes here and whether it can be enabled.

    Each kind is enabled and immediately disabled to ask CUPTI; nothing is traced. Raises
    ``NoGpuError`` where there is no driver or GPU.
    """
    driver.require_gpu()
    lib = library.libcupti()
    rows = []
    for spec in KINDS.values():
        size = driver.struct_size(spec.kind) or 0
        chosen = choose_dtype(spec.kind, size) if size else None
        code = lib.cuptiActivityEnable(spec.kind)
        if code == library.SUCCESS:
            lib.cuptiActivityDisable(spec.kind)
        note = spec.note if code == library.SUCCESS else library.result_name(code)
        rows.append(
            KindInfo(
                name=spec.name, kind=spec.kind, event=spec.event, record=chosen[0] if chosen else "",
                record_size=size, supported=code == library.SUCCESS, note=note,
            )
        )  # fmt: skip
    return rows
