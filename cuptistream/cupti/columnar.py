"""Activity records → msgpack event elements in bulk: no Python object per record.

For the kinds that arrive by the hundred thousand per second (kernels, memory copies and sets, API
calls), ``Decoder.decode_packed`` skips the event Structs. Records that share their string fields
(a kernel name, an API name, a copy direction) form a group; each group's elements have one fixed
layout, built once from a template and filled column by column with numpy.

The encoding is the events' own (a map with the ``type`` tag), with every field present and every
integer written as int64 (``0xd3``): valid msgpack that decodes to exactly the Structs the
per-record path builds (``tests/test_columnar.py`` checks that on real captures). Within one
buffer, events come out grouped by kind and by their string fields rather than in record order;
nothing in a buffer is time-ordered to begin with (concurrent kernels complete out of order).

``Packer.pack_columns`` writes the same records as one ``events.Columns`` element instead (the
file sink's stored form), and ``expand`` turns that element back into exactly the elements
``Packer.pack`` writes: the readers' fallback (``codec.expand_columns``), for Structs that
``column_structs`` cannot build straight from the columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set

import msgspec
import numpy as np

from cuptistream.events import Columns

_encode = msgspec.msgpack.encode
_INT64 = b"\xd3"
_BLOCK = 1024  # records filled at a time: their rows (~300 KB for kernels) stay in the cache

# Where packed elements are written: ``allocate(nbytes)`` gives a uint8 array of that many bytes, or
# None (then the heap): a decode worker's reply slot (``collector.reply_slots``).
Allocate = Callable[[int], "np.ndarray | None"]


class Packer:
    """Packs events of one type: integer fields, 3-tuples of integers, then string fields."""

    def __init__(
        self, tag: str, ints: Sequence[str], triples: Sequence[str] = (), strings: Sequence[str] = ()
    ):
        self.tag = tag
        self.ints, self.triples, self.strings = list(ints), list(triples), list(strings)
        fields = 1 + len(self.ints) + len(self.triples) + len(self.strings)
        prefix = bytearray(b"\xde" + fields.to_bytes(2, "big") + _encode("type") + _encode(tag))
        slots: list[int] = []  # byte offset of each int64 value, in (ints, then triples) order
        for name in self.ints:
            prefix += _encode(name) + _INT64
            slots.append(len(prefix))
            prefix += bytes(8)
        for name in self.triples:
            prefix += _encode(name) + b"\x93"
            for _ in range(3):
                prefix += _INT64
                slots.append(len(prefix))
                prefix += bytes(8)
        self.prefix = np.frombuffer(bytes(prefix), dtype=np.uint8)
        self._slots = slots
        self._layouts: dict[int, np.dtype[np.void]] = {}
        self._keys = [_encode(name) for name in self.strings]

    def pack(
        self,
        ints: Mapping[str, np.ndarray],
        triples: Mapping[str, Sequence[np.ndarray]],
        groups: np.ndarray,
        group_strings: Sequence[Sequence[str]],
        allocate: Allocate | None = None,
        grouped: bool = False,
    ) -> bytes | memoryview:
        """Elements for ``len(groups)`` records. ``groups[i]`` indexes ``group_strings``: the values
        of the string fields that record i has. The elements are written into one buffer (from
        ``allocate`` where it gives one), returned as a view of it. ``grouped``: the records come
        group by group already (``groups`` ascending)."""
        count = len(groups)
        if count == 0:
            return b""
        # One group, or grouped: the records in their own order, taken by slices, not gathered.
        order = np.argsort(groups, kind="stable") if len(group_strings) > 1 and not grouped else None
        found = np.searchsorted(
            groups[order] if order is not None else groups, np.arange(len(group_strings) + 1)
        )
        bounds = found.tolist()
        suffixes = [
            np.frombuffer(
                b"".join(key + _encode(text) for key, text in zip(self._keys, texts, strict=True)), np.uint8
            )
            for texts in group_strings
        ]
        # Each group's rows go straight into the one output buffer, group after group (a copy per
        # group and a join of them cost ~7 % of a decode worker's time on W3's kernels).
        width = len(self.prefix)
        strides = [width + len(suffix) for suffix in suffixes]
        starts = np.concatenate(([0], np.cumsum(np.diff(found) * np.array(strides, dtype=np.int64)))).tolist()
        out = allocate(starts[-1]) if allocate is not None else None
        if out is None:
            out = np.empty(starts[-1], np.uint8)
        # The integer part of an element has the same layout in every group: fill it for many
        # records at once (one strided copy per field), then give each group its string suffix.
        # Filling it per group would cost ~15 numpy calls per group, and packing is a large part of
        # the collector's time. It is filled _BLOCK records at a time, so that its 18 strided passes
        # over the rows stay in the cache (faster than one pass over all the records).
        head = np.empty((min(count, _BLOCK), width), dtype=np.uint8)
        fields = np.ndarray((len(head),), dtype=self._layout(width), buffer=head)
        names = fields.dtype.names or ()
        columns = [np.asarray(column) for column in self._columns(ints, triples)]
        group = 0
        for first in range(0, count, _BLOCK):
            last = min(first + _BLOCK, count)
            part = order[first:last] if order is not None else slice(first, last)
            rows = head[: last - first]
            rows[:] = self.prefix
            block = fields[: last - first]
            for name, column in zip(names, columns, strict=True):
                block[name] = column[part]
            at = first
            while at < last:  # the block's rows to their groups' places in the output
                while bounds[group + 1] <= at:
                    group += 1
                end, stride = min(last, bounds[group + 1]), strides[group]
                where = starts[group] + (at - bounds[group]) * stride
                dest = out[where : where + (end - at) * stride].reshape(end - at, stride)
                dest[:, :width] = rows[at - first : end - first]
                dest[:, width:] = suffixes[group]
                at = end
        return out.data

    def pack_columns(
        self,
        ints: Mapping[str, np.ndarray],
        triples: Mapping[str, Sequence[np.ndarray]],
        groups: np.ndarray,
        group_strings: Sequence[Sequence[str]],
        allocate: Allocate | None = None,
    ) -> bytes | memoryview:
        """The same records as one ``Columns`` element (arguments as ``pack``'s), rows group by group
        as ``pack`` orders them. Its integers are written straight into the buffer (from
        ``allocate`` where it gives one) as differences between rows: W3's kernels then take ~1.4
        bytes a record after zstd, against ~7.8 as maps."""
        count = len(groups)
        if count == 0:
            return b""
        order = np.argsort(groups, kind="stable") if len(group_strings) > 1 else None
        columns = self._columns(ints, triples)
        element = Columns(
            event=self.tag, rows=count, ints=self.ints, triples=self.triples, strings=self.strings,
            groups=[list(texts) for texts in group_strings],
            counts=np.bincount(groups, minlength=len(group_strings)).tolist(), values=b"",
        )  # fmt: skip
        # ``values`` is encoded last, as an empty bin (2 bytes): put its real header in their place.
        head = _encode(element)[:-2] + b"\xc6" + (len(columns) * count * 8).to_bytes(4, "big")
        size = len(head) + len(columns) * count * 8
        out = allocate(size) if allocate is not None else None
        if out is None:
            out = np.empty(size, np.uint8)
        out[: len(head)] = np.frombuffer(head, np.uint8)
        deltas = out[len(head) :].view("<i8").reshape(len(columns), count)
        # Every column into one int64 table in the records' order (strided reads, in order), the
        # table reordered by group in one take, and the differences in one call, rather than a
        # reorder and a subtraction per column (W3's kernels: 142 against 175 ns a record, 2-core VM).
        # In int64, wrapping: unsigned 64-bit values come back bit for bit, as ``pack`` writes them.
        table = np.empty((len(columns), count), np.int64)
        for row, column in zip(table, columns, strict=True):
            np.copyto(row, column, casting="unsafe")
        if order is not None:
            table = table.take(order, axis=1)
        deltas[:, :1] = table[:, :1]
        np.subtract(table[:, 1:], table[:, :-1], out=deltas[:, 1:])
        return out.data

    def _columns(
        self, ints: Mapping[str, np.ndarray], triples: Mapping[str, Sequence[np.ndarray]]
    ) -> list[np.ndarray]:
        """The value of every int64 slot, in slot order (ints, then each triple's three parts)."""
        return [ints[name] for name in self.ints] + [part for name in self.triples for part in triples[name]]

    def _layout(self, itemsize: int) -> np.dtype[np.void]:
        """The int64 value slots of one element of ``itemsize`` bytes, as a structured dtype."""
        layout = self._layouts.get(itemsize)
        if layout is None:
            names = [f"v{j}" for j in range(len(self._slots))]
            layout = np.dtype({"names": names, "formats": [">i8"] * len(names), "offsets": self._slots,
                               "itemsize": itemsize})  # fmt: skip
            self._layouts[itemsize] = layout
        return layout


def group_by(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group ids per record for the combination of ``keys``, and one representative row per group
    (indices into the records), so each distinct combination is resolved once."""
    if all(len(k) and (k == k[0]).all() for k in keys):  # one group (one kernel, one copy kind): no sort
        return np.zeros(len(keys[0]), dtype=np.intp), np.zeros(1, dtype=np.intp)
    if len(keys) == 1:
        _, first, inverse = np.unique(keys[0], return_index=True, return_inverse=True)
        return inverse.reshape(-1), first
    stacked = np.stack([np.asarray(k, dtype=np.int64) for k in keys], axis=1)
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


_PACKERS: dict[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], Packer] = {}


def expand(
    element: Columns, fields: Set[str] | None = None, head: bytes = b"", zero_default: Set[str] = frozenset()
) -> memoryview:
    """``head``, then the msgpack elements of the ``element.rows`` events a ``Columns`` element
    stands for: what ``Packer.pack`` wrote for the same records. ``fields``: only these (a reader
    whose Structs read a few fields skips packing and parsing the rest); ``zero_default``: fields
    left out where they are zero in every row (the reader's Struct defaults them to zero). Raises
    ``msgspec.ValidationError`` for an element whose sizes do not add up (a damaged one)."""
    element.check()
    rows, groups = element.rows, element.groups
    slots = len(element.ints) + 3 * len(element.triples)
    stored = np.frombuffer(element.values, "<i8").reshape(slots, rows)

    def keep(name: str, first: int = 0, width: int = 0) -> bool:
        if fields is not None and name not in fields:
            return False
        return name not in zero_default or bool(stored[first : first + width].any())

    ints = [(k, name) for k, name in enumerate(element.ints) if keep(name, k, 1)]
    at = len(element.ints)
    triples = [(at + 3 * k, name) for k, name in enumerate(element.triples) if keep(name, at + 3 * k, 3)]
    strings = [k for k, name in enumerate(element.strings) if keep(name)]
    key = (
        element.event, tuple(n for _, n in ints), tuple(n for _, n in triples),
        tuple(element.strings[k] for k in strings),
    )  # fmt: skip
    packer = _PACKERS.get(key)
    if packer is None:
        packer = _PACKERS[key] = Packer(*key)
    chosen = [k for k, _ in ints] + [k + j for k, _ in triples for j in range(3)]
    values = np.cumsum(stored[chosen], axis=1) if chosen else stored[:0]
    by_slot = dict(zip(chosen, values, strict=True))
    out = None

    def allocate(nbytes: int) -> np.ndarray:
        nonlocal out
        out = np.empty(len(head) + nbytes, np.uint8)
        out[: len(head)] = np.frombuffer(head, np.uint8)
        return out[len(head) :]

    packer.pack(
        {name: by_slot[k] for k, name in ints},
        {name: [by_slot[k + j] for j in range(3)] for k, name in triples},
        np.repeat(np.arange(len(groups)), element.counts),
        [[texts[k] for k in strings] for texts in groups],
        allocate,
        grouped=True,
    )
    assert out is not None
    return out.data
