"""Events straight from an ``events.Columns`` element: the Structs built from its columns.

A reader that meets a Columns element (the file sink's stored form of the hot kinds) wants its
events as Structs. Here each field the Struct reads becomes one column (integers summed up from
their row deltas, strings repeated group by group), and the Structs are made from the columns in
one C-level pass (``itertools.starmap``): no msgpack maps packed and decoded in between
(``cupti.columnar.expand``, which stays the fallback). The sums are numpy's: summed in Python
instead, which spares numpy's import, 100k events read 1.5x faster but 400k 1.1x and 2M 1.4x
slower (VM).

Building a Struct does not check its fields' types as decoding does, so a Struct class is built
here only where each field it reads from the element is of a type whose decoded value is exactly
the column's (``int``, ``str``, a 3-tuple of ints, each unconstrained, or one of them or None),
and each field the element lacks has an immutable default. ``build`` returns None otherwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from itertools import chain, repeat, starmap
from typing import Any

import msgspec
import msgspec.inspect as mi

from cuptistream.events import Columns

# How a field is filled: from an integer slot, from a triple's first slot, from a string (its index
# in ``Columns.strings``), or with one value for every row (the Struct's default).
_INT, _TRIPLE, _STRING, _VALUE = range(4)
_KINDS = ((mi.IntType(), _INT), (mi.StrType(), _STRING), (mi.TupleType((mi.IntType(),) * 3), _TRIPLE))
_IMMUTABLE = (int, float, str, bytes, tuple, type(None))  # defaults every row may share


def build(element: Columns, cls: type) -> list[Any] | None:
    """The events ``element`` stands for, as ``cls`` Structs in its row order, or None where ``cls``
    has a field not filled exactly here (see the module docstring). ``element`` passed
    ``Columns.check``."""
    plan = _plan(cls, tuple(element.ints), tuple(element.triples), tuple(element.strings))
    if plan is None:
        return None
    import numpy as np  # only where a reader meets columns (~0.15 s to import)

    rows = element.rows
    stored = np.frombuffer(element.values, "<i8").reshape(-1, rows)

    def ints(slot: int) -> list[int] | int:
        """A slot's values (its deltas summed up in int64, which wraps as the writer's differences
        did), or its one value where no row differs from the one before."""
        deltas = stored[slot]
        return deltas.cumsum().tolist() if deltas[1:].any() else int(deltas[0])

    columns: list[Any] = []
    for kind, at in plan:
        if kind == _INT:
            column = ints(at)
            columns.append(repeat(column, rows) if type(column) is int else column)
        elif kind == _TRIPLE:
            parts = [ints(at + k) for k in range(3)]
            if all(type(part) is int for part in parts):  # one tuple for every row
                columns.append(repeat(tuple(parts), rows))
            else:
                columns.append(zip(*(repeat(p, rows) if type(p) is int else p for p in parts), strict=True))
        elif kind == _STRING:
            columns.append(_strings(element, at))
        else:
            columns.append(repeat(at, rows))
    return list(starmap(cls, zip(*columns, strict=True) if columns else repeat((), rows)))


def _strings(element: Columns, index: int) -> Iterator[str]:
    """String field ``index`` row by row: each group's value, as many times as it has rows."""
    if len(element.groups) == 1:
        return repeat(element.groups[0][index], element.rows)
    return chain.from_iterable(map(repeat, [texts[index] for texts in element.groups], element.counts))


@functools.cache
def _plan(
    cls: type, ints: tuple[str, ...], triples: tuple[str, ...], strings: tuple[str, ...]
) -> tuple[tuple[int, Any], ...] | None:
    """How to fill each field of ``cls``, in its positional order, from an element of this layout
    (``_INT``, slot), (``_TRIPLE``, first slot), (``_STRING``, index), (``_VALUE``, default); None
    where some field cannot be (the maps path then decodes it, or refuses the element as it always
    did, e.g. a required field missing)."""
    parameters = inspect.signature(cls).parameters.values()
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters):
        return None  # keyword-only fields: no positional construction
    info = mi.type_info(cls)
    if not isinstance(info, mi.StructType):
        return None
    slots = {name: (_INT, k) for k, name in enumerate(ints)}
    slots.update({name: (_TRIPLE, len(ints) + 3 * k) for k, name in enumerate(triples)})
    slots.update({name: (_STRING, k) for k, name in enumerate(strings)})
    plan = []
    for field in info.fields:
        found = slots.get(field.encode_name)
        if found is None:
            if field.required or field.default_factory is not msgspec.NODEFAULT:
                return None
            if not isinstance(field.default, _IMMUTABLE):
                return None
            plan.append((_VALUE, field.default))
        elif _kind(field.type) == found[0]:
            plan.append(found)
        else:
            return None
    return tuple(plan)


def _kind(type_: mi.Type) -> int | None:
    """The kind of column whose values a field of this type decodes to unchanged, if any."""
    if isinstance(type_, mi.UnionType) and len(type_.types) == 2 and mi.NoneType() in type_.types:
        (type_,) = (t for t in type_.types if t != mi.NoneType())
    return next((kind for known, kind in _KINDS if type_ == known), None)
