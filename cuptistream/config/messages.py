"""Config errors in one line that names the key path: a msgspec ``ValidationError`` turned into
``sinks[0].queue.max_bytes: expected int, got "lots"``, or ``...: unknown key (known keys: ...)``.

``cuptistream.config.convert`` raises ``ConfigError`` with these messages; they read the YAML that
failed (``data``) and the model it was checked against, never the config being built.
"""

from __future__ import annotations

import re
import types
from typing import Any

import msgspec

_AT = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_EXPECTED_GOT = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>.+)`$", re.DOTALL)


def _lookup(data: Any, path: str) -> Any:
    for key in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        name, index = key
        try:
            data = data[int(index)] if index else data[name]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def short(value: Any) -> str:
    text = msgspec.json.encode(value).decode() if _json_safe(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_safe(value: Any) -> bool:
    try:
        msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError):
        return False
    return True


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path.lstrip(".") or "<top level>"
    return prefix + path


def validation_message(error: msgspec.ValidationError, data: Any, prefix: str, model: type) -> str:
    text = str(error)
    match = _AT.match(text)
    msg, path = (match.group("msg"), match.group("path")) if match else (text, "")
    if unknown := _UNKNOWN.match(msg):
        field = unknown.group("field")
        target = _lookup_model(model, path)
        known = ", ".join(f for f in getattr(target, "__struct_fields__", ()) if f != "type")
        hint = f" (known keys: {known})" if known else ""
        return f"{_join(prefix, path + '.' + shown_key(field))}: unknown key{hint}"
    if expected := _EXPECTED_GOT.match(msg):
        want = expected.group("want")
        if "[...]" in path:  # msgspec does not name the mapping key; find the offending entry
            path = _name_mapping_key(data, path, want)
        got = _lookup(data, path)
        want = {"object": "a mapping", "array": "a list"}.get(want, want)
        return f"{_join(prefix, path)}: expected {want}, got {short(got)}"
    if msg.startswith("Invalid enum value"):
        allowed = _allowed_values(model, path)
        if allowed:
            return f"{_join(prefix, path)}: {short(_lookup(data, path))} is not {allowed}"
    if msg.startswith("Object missing required field"):
        field = msg.split("`")[1]
        return f"{_join(prefix, path + '.' + field)}: required key is missing"
    return f"{_join(prefix, path)}: {msg[0].lower() + msg[1:] if msg else 'invalid value'}"


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
}


def _name_mapping_key(data: Any, path: str, want: str) -> str:
    head, _, tail = path.partition("[...]")
    mapping = _lookup(data, head)
    accepted = _PY_TYPES.get(want)
    if isinstance(mapping, dict) and accepted and not tail:
        for key, value in mapping.items():
            if not isinstance(value, accepted) or (bool not in accepted and isinstance(value, bool)):
                return f"{head}.{key}"
    return path


def _allowed_values(model: type, path: str) -> str:
    """What a ``Literal`` key (alone or beside ``int``) accepts, in words: "one of a, b" or "a or a
    whole number"; "" where the annotation cannot be found."""
    import typing

    parent, _, field = path.rpartition(".")
    owner = _lookup_model(model, parent)
    if owner is None or not field:
        return ""
    hint = typing.get_type_hints(owner).get(field)
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    words = [str(v) for m in members if typing.get_origin(m) is typing.Literal for v in typing.get_args(m)]
    if not words:
        return ""
    if int in members:
        return f"{' or '.join(words)} or a whole number"
    return f"one of {', '.join(words)}" if len(words) > 1 else words[0]


def _lookup_model(model: type, path: str) -> type | None:
    """The Struct type found by following ``path`` through ``model``'s annotations (best effort)."""
    import typing

    current: Any = model
    for name, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        hints = typing.get_type_hints(current) if isinstance(current, type) else {}
        if index:
            args = typing.get_args(current)
            current = args[0] if args else None
        else:
            current = hints.get(name)
        for arg in typing.get_args(current) or ():  # Optional[X] / list[X]
            if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
                current = arg
    return current if isinstance(current, type) else None


def shown_key(key: object) -> str:
    """A key as a message shows it: invisible characters (a no-break space, a tab, NUL) escaped,
    quoted if it starts or ends with a space, so the user sees what is wrong with it."""
    text = str(key)
    shown = text if text.isprintable() else repr(text)[1:-1]
    return shown if shown == shown.strip() else repr(text)
