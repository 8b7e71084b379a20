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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

_encode = msgspec.msgpack.encode
_INT64 = b"\xd3"


class Packer:
    """Packs events of one type: integer fields, 3-tuples of integers, then string fields."""

    def __init__(
        self, tag: str, ints: Sequence[str], triples: Sequence[str] = (), strings: Sequence[str] = ()
    ):
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
    ) -> bytes | memoryview:
        """Elements for ``len(groups)`` records. ``groups[i]`` indexes ``group_strings``: the values
        of the string fields that record i has. The elements are written into one buffer, returned
        as a view of it."""
        count = len(groups)
        if count == 0:
            return b""
        order = np.argsort(groups, kind="stable")
        bounds = np.searchsorted(groups[order], np.arange(len(group_strings) + 1))
        # The integer part of an element has the same layout in every group: fill it for all the
        # records at once (one strided copy per field), then give each group its string suffix.
        # Filling it per group cost ~15 numpy calls per group (issue 30's profile: packing was
        # ~45% of the collector's time, much of it per group).
        width = len(self.prefix)
        head = np.empty((count, width), dtype=np.uint8)
        head[:] = self.prefix
        fields = np.ndarray((count,), dtype=self._layout(width), buffer=head)
        names = fields.dtype.names or ()
        for name, column in zip(names, self._columns(ints, triples), strict=True):
            fields[name] = np.asarray(column)[order]
        # Each group's rows go straight into the one output buffer (a copy per group and a join of
        # them cost ~7 % of a decode worker's time on W3's kernels).
        suffixes = [
            b"".join(key + _encode(text) for key, text in zip(self._keys, strings, strict=True))
            for strings in group_strings
        ]
        sizes = np.diff(bounds)
        out = np.empty(int(sizes @ (width + np.array([len(s) for s in suffixes], dtype=np.int64))), np.uint8)
        at = 0
        for group, suffix in enumerate(suffixes):
            lo, hi = int(bounds[group]), int(bounds[group + 1])
            if lo == hi:
                continue
            rows = out[at : at + (hi - lo) * (width + len(suffix))].reshape(hi - lo, width + len(suffix))
            rows[:, :width] = head[lo:hi]
            rows[:, width:] = np.frombuffer(suffix, dtype=np.uint8)
            at += rows.nbytes
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
    if len(keys) == 1:
        _, first, inverse = np.unique(keys[0], return_index=True, return_inverse=True)
        return inverse.reshape(-1), first
    stacked = np.stack([np.asarray(k, dtype=np.int64) for k in keys], axis=1)
    _, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first
