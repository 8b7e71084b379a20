"""Property-based fuzzing of configs through ``cuptistream.config.load`` (what ``cuptistream validate``
and every command that takes ``-c`` run): random YAML text, binary files, deep nesting, aliases,
duplicate keys, and the shipped configs with one value replaced by a wrong type, a huge, zero,
negative or non-finite number, unicode, a nested structure. Every outcome is a Config whose numbers
are sane, or one ``ConfigError`` line naming the key path; never another exception. Settings:
helpers/fuzzing.py."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from helpers.fuzzing import FUZZ
from hypothesis import given
from hypothesis import strategies as st

from cuptistream.config import Config, Duration, Size, load
from cuptistream.errors import ConfigError

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
BASES = {path.name: yaml.safe_load(path.read_text()) for path in CONFIGS}


def one_line(error: ConfigError) -> str:
    message = str(error)
    assert message and len(message.splitlines()) == 1 and message == message.strip(), repr(message)
    return message


def check_sane(value: Any, where: str = "") -> None:
    """What validation lets through: finite numbers, no negative sizes or durations, no NUL bytes."""
    if isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            if field != "raw":  # the parsed YAML, kept as given
                check_sane(getattr(value, field), f"{where}.{field}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_sane(item, f"{where}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_sane(key, f"{where} key")
            check_sane(item, f"{where}.{key}")
    elif isinstance(value, float):
        assert math.isfinite(value), where
        assert not isinstance(value, Duration) or value >= 0, where
    elif isinstance(value, int) and not isinstance(value, bool):
        assert -(2**63) <= value < 2**63, where
        assert not isinstance(value, Size) or value >= 0, where
    elif isinstance(value, str):
        assert "\0" not in value, where


def load_or_error(source: Any) -> Config | str:
    try:
        config = load(source)
    except ConfigError as error:
        return one_line(error)
    check_sane(config)
    return config


# --- YAML text and bytes ----------------------------------------------------------------------

YAML_TOKENS = st.sampled_from(
    [
        "pipeline:", "sinks:", "sources:", "probe:", "session:", "- ", "  ", "\n", ": ", "{", "}", "[",
        "]", ",", "&a ", "*a", "<<: *a", "!!str ", "!!binary ", "!!python/object:os.system ", "~", "null",
        ".nan", ".inf", "-.inf", "1e400", "0x10", "0o17", "-1", "0", "type: file", "type: null",
        "directory: ", "batch:", "max_events: ", "max_latency: ", "memory_budget: ", "1KiB", "2h",
        "'quoted'", '"\\u2028"', "é", "💥", "\t", "#", "%YAML 1.1\n", "---\n", "...\n", "? ", "|\n",
        "2001-13-45", "2001-02-30 25:61:00", "!!float ", "!!int ", "!!timestamp ", "!!bool ", "0b", "0x",
        "9" * 5000, "1_000", "1:30:00", "!!set ", "!!omap ", "!!pairs ", "=", "<<",
    ]
)  # fmt: skip


@FUZZ
@given(tokens=st.lists(YAML_TOKENS | st.text(max_size=8), max_size=40))
def test_random_yaml_text(tmp_path_factory: pytest.TempPathFactory, tokens: list[str]) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text("".join(tokens), encoding="utf-8")
    load_or_error(path)


@FUZZ
@given(data=st.binary(max_size=2000))
def test_binary_files(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_bytes(data)
    load_or_error(path)


@FUZZ
@given(depth=st.integers(1, 20_000), kind=st.sampled_from(["[", "{a: ", "- "]))
def test_deep_nesting(tmp_path_factory: pytest.TempPathFactory, depth: int, kind: str) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    closing = {"[": "]", "{a: ": "}", "- ": ""}[kind]
    body = (
        kind * depth + "1" + closing * depth
        if kind != "- "
        else "".join("  " * i + "- " + ("\n" if i < depth - 1 else "1") for i in range(min(depth, 2000)))
    )
    path.write_text("pipeline: " + body)
    assert isinstance(load_or_error(path), str)


@FUZZ
@given(levels=st.integers(1, 12), width=st.integers(1, 12), duplicate=st.booleans())
def test_aliases_and_duplicate_keys(
    tmp_path_factory: pytest.TempPathFactory, levels: int, width: int, duplicate: bool
) -> None:
    lines = ["a0: &a0 [x]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * width)}]")
    lines.append(
        f"session: {{attributes: {{k: v}}}}\nsinks: [{{type: file, directory: out, prefix: *a{levels - 1}}}]"
    )
    if duplicate:
        lines.append("session: {}")
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text("\n".join(lines))
    message = load_or_error(path)
    assert isinstance(message, str)  # unknown top-level keys, a list as a prefix, a duplicate, a bomb


# --- the shipped configs, one value made wrong ------------------------------------------------


def _paths(data: Any, prefix: str = "") -> list[tuple[str, tuple[Any, ...]]]:
    """Every key path in parsed YAML: (dotted path, the keys to reach it)."""
    found: list[tuple[str, tuple[Any, ...]]] = []

    def walk(node: Any, text: str, keys: tuple[Any, ...]) -> None:
        if keys:
            found.append((text, keys))
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, f"{text}.{key}" if text else str(key), (*keys, key))
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, f"{text}[{index}]", (*keys, index))

    walk(data, prefix, ())
    return found


NUMBERS = st.sampled_from(
    [0, -1, 1, 2**31, 2**63, 2**64 + 1, -(2**70), 10**400 // 10**300, 0.0, -0.0, 1e-300, 1e308, -1.5,
     math.nan, math.inf, -math.inf]
) | st.integers() | st.floats()  # fmt: skip
STRINGS = st.sampled_from(
    ["", "0", "-1", "1e400", "nan", "inf", "-5MiB", "0s", "nanms", "infs", "1e400 MiB", "9" * 400 + "KiB",
     "1 EiB", "5min", "0o777", "a\nb", "a\x00b", "\u2028", "💥", "ünïcode", "x" * 5000]
) | st.text(max_size=30)  # fmt: skip
VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | STRINGS | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    name = draw(st.sampled_from(sorted(BASES)))
    data = copy.deepcopy(BASES[name])
    text, keys = draw(st.sampled_from(_paths(data)))
    parent = data
    for key in keys[:-1]:
        parent = parent[key]
    operation = draw(st.sampled_from(["replace", "replace", "replace", "delete", "unknown"]))
    if operation == "replace":
        parent[keys[-1]] = draw(VALUES)
    elif operation == "delete":
        del parent[keys[-1]]
    elif isinstance(parent, dict):
        extra = draw(STRINGS.filter(lambda k: k not in parent))
        parent[extra] = draw(VALUES)
        text = f"{text.rsplit('.', 1)[0]}.{extra}" if "." in text else extra
    return data, text, operation


def _names(message: str, path: str) -> bool:
    """Whether ``message`` names ``path``: it starts with the path, a key inside it, or a parent
    of it followed by the path's last key."""
    head = message.split(": ", 1)[0]
    if head == path or head.startswith((path + ".", path + "[")):
        return True
    named = re.sub(r"(\[\d+\])+$", "", path)  # an item of a list is named by its list (and value)
    leaf = re.split(r"[.\[]", named)[-1]
    return path.startswith(head) and leaf in message


@FUZZ
@given(case=mutated())
def test_one_wrong_value_is_refused_naming_its_key_path(case: tuple[dict[str, Any], str, str]) -> None:
    data, path, operation = case
    result = load_or_error(data)
    if (
        isinstance(result, str)
        and operation == "replace"
        and not re.search(r"(^|\.)(type|name|enabled)$", path)
    ):
        # type/name/enabled changes surface elsewhere (another component's keys, a duplicate name,
        # no sink left), still as one line.
        assert _names(result, path), (path, result)


TAGS = [
    "!!float",
    "!!int",
    "!!bool",
    "!!timestamp",
    "!!binary",
    "!!set",
    "!!omap",
    "!!pairs",
    "!!map",
    "!!seq",
]
TAGGED = ["", "x", "[1]", "{a: 1}", "0b", "0x", "1_", "2001-13-45", "=", "~", "[[1, 2]]", "9" * 5000]


@pytest.mark.parametrize("tag", TAGS)
def test_values_yaml_cannot_convert_are_one_line(tmp_path: Path, tag: str) -> None:
    """Found by the fuzz tests: PyYAML raised ValueError, IndexError, KeyError, TypeError or
    AttributeError (a traceback) converting a bad date, an empty tagged value or a 5000-digit int."""
    for value in TAGGED:
        path = tmp_path / "c.yaml"
        path.write_text(f"pipeline: {{memory_budget: {tag} {value}}}\n")
        load_or_error(path)


@pytest.mark.parametrize("key", ["a\nb", "a\u2028b", "\xa0pipeline", " x", "a`b", " \x00"])
def test_unknown_keys_with_odd_characters_name_their_path(key: str) -> None:
    """Found by the nightly run: an unknown key with a line break inside a section lost its path
    (the message said ``<top level>``)."""
    message = load_or_error({"pipeline": {"batch": {key: 1}}})
    assert isinstance(message, str) and message.startswith("pipeline.batch."), message
