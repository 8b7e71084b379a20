"""OTLP request bodies: protobuf or OTLP/JSON, and splitting a request that is over the byte limit.

OTLP/JSON is protobuf's JSON mapping with two differences that ``json_format`` does not know:
trace and span ids are hex strings (not base64), and enums are integers.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def _ids(node: Any, convert: Callable[[str], str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _ids(value, convert)
    elif isinstance(node, list):
        for value in node:
            _ids(value, convert)


def to_json(message: Message) -> bytes:
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    _ids(data, lambda b64: base64.b64decode(b64).hex())
    return json.dumps(data, separators=(",", ":")).encode()


def from_json(data: bytes, message: M) -> M:
    """Parse OTLP/JSON into ``message``. Raises ValueError on malformed input."""
    tree = json.loads(data)
    try:
        _ids(tree, lambda hexed: base64.b64encode(bytes.fromhex(hexed)).decode())
    except (ValueError, binascii.Error) as error:
        raise ValueError(f"bad hex id in OTLP/JSON: {error}") from None
    return json_format.ParseDict(tree, message, ignore_unknown_fields=True)


def encode(message: Message, encoding: str) -> bytes:
    return to_json(message) if encoding == "json" else message.SerializeToString()


def split(
    items: Sequence[T], encode_items: Callable[[Sequence[T]], bytes], limit: int
) -> tuple[list[tuple[bytes, int]], int]:
    """Encode ``items`` as request bodies of at most ``limit`` bytes each.

    Returns ``[(body, item_count), ...]`` and the number of items that do not fit on their own
    (those are left out). Over the limit, the items are cut into even parts, and any part still over
    is cut again, so the common case (under the limit) encodes once.
    """
    if not items:
        return [], 0
    body = encode_items(items)
    if len(body) <= limit:
        return [(body, len(items))], 0
    if len(items) == 1:
        return [], 1
    parts = min(len(items), -(-len(body) // limit))  # >= 2, so every part is smaller than items
    size = -(-len(items) // parts)
    out: list[tuple[bytes, int]] = []
    too_large = 0
    for start in range(0, len(items), size):
        bodies, big = split(items[start : start + size], encode_items, limit)
        out += bodies
        too_large += big
    return out, too_large
