"""Keeps docs/events.md and docs/config.md complete: every event field and every config key that
exists in the code must have a row in its type's or component's section, and every row must name
something that exists. Adding a field or key without documenting it fails here.

The docs are parsed as markdown: a section runs from a heading to the next heading of the same or a
higher level (so subsections belong to it), and a documented name is the first cell of a table row,
in backticks, in a table whose header starts with ``field`` (events) or ``key`` (config).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import msgspec
import pytest

from cuptistream import events
from cuptistream.config.model import (
    OverheadConfig,
    PipelineConfig,
    ProbeConfig,
    SessionConfig,
    SinkConfig,
    SourceConfig,
    StacksConfig,
    StatisticsConfig,
    _RawConfig,
    registry,
)
from cuptistream.errors import ConfigError

DOCS = Path(__file__).resolve().parent.parent / "docs"


# --- a small markdown reader -------------------------------------------------------------------


@dataclass
class Section:
    title: str
    level: int
    lines: list[str]


def sections(path: Path) -> list[Section]:
    """Every heading's section, nested sections included in their parents' lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    headings = []
    in_code = False
    for index, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^(#{1,6})\s+(.*)$", line)):
            headings.append((index, len(match.group(1)), match.group(2).strip()))
    result = []
    for position, (start, level, title) in enumerate(headings):
        end = next((i for i, lvl, _ in headings[position + 1 :] if lvl <= level), len(lines))
        result.append(Section(title, level, lines[start + 1 : end]))
    return result


def find_section(path: Path, pattern: str) -> Section:
    """The one section whose heading matches ``pattern`` (a regex, searched)."""
    found = [s for s in sections(path) if re.search(pattern, s.title)]
    assert found, f"{path.name}: no heading matching {pattern!r}; add a section for it"
    assert len(found) == 1, f"{path.name}: several headings match {pattern!r}: {[s.title for s in found]}"
    return found[0]


def table_rows(section: Section, first_header: str) -> dict[str, list[str]]:
    """Rows of the section's tables whose header's first cell is ``first_header``: name → cells."""
    rows: dict[str, list[str]] = {}
    in_table = False
    for line in section.lines:
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:
            in_table = cells[0] == first_header  # a header row starts a table
            continue
        if match := re.fullmatch(r"`([^`]+)`", cells[0]):
            rows[match.group(1)] = cells
    return rows


# --- events ------------------------------------------------------------------------------------

EVENTS_MD = DOCS / "events.md"
NESTED = [
    events.Batch, events.Resource, events.ClockSync, events.DeviceInfo,
    events.PcSample, events.SassRecord, events.StageStats,
]  # fmt: skip
ALL_EVENT_STRUCTS = [*events.EVENT_TYPES.values(), *NESTED]


def _event_section(cls: type[msgspec.Struct]) -> Section:
    tag = cls.__struct_config__.tag
    if isinstance(tag, str):  # an event: its heading names the tag and the class
        return find_section(EVENTS_MD, rf"^`{re.escape(tag)}` — {cls.__name__}$")
    return find_section(EVENTS_MD, rf"^{cls.__name__}$")


@pytest.mark.parametrize("cls", ALL_EVENT_STRUCTS, ids=lambda c: c.__name__)
def test_every_event_field_is_documented_with_a_unit(cls: type[msgspec.Struct]) -> None:
    rows = table_rows(_event_section(cls), "field")
    fields = [f.encode_name for f in msgspec.structs.fields(cls)]
    missing = [name for name in fields if name not in rows]
    assert not missing, f"docs/events.md, section {cls.__name__}: fields not documented: {missing}"
    for name in fields:
        assert len(rows[name]) == 4 and all(rows[name]), (
            f"docs/events.md, {cls.__name__}.{name}: the row needs field | type | unit | meaning"
        )
    stale = sorted(set(rows) - set(fields))
    assert not stale, f"docs/events.md, section {cls.__name__}: rows for fields that do not exist: {stale}"


def test_every_documented_event_type_exists() -> None:
    documented = {
        match.group(1)
        for s in sections(EVENTS_MD)
        if s.level == 3 and (match := re.match(r"^`([a-z_]+)` — ", s.title))
    }
    assert documented == set(events.EVENT_TYPES), (
        f"docs/events.md: undocumented types {sorted(set(events.EVENT_TYPES) - documented)}, "
        f"documented types that do not exist {sorted(documented - set(events.EVENT_TYPES))}"
    )


def test_events_doc_states_the_schema_version() -> None:
    text = find_section(EVENTS_MD, r"^Compatibility$").lines
    assert f"(now `{events.SCHEMA_VERSION}`)" in "\n".join(text), "docs/events.md: update the SCHEMA_VERSION"


# --- config ------------------------------------------------------------------------------------

CONFIG_MD = DOCS / "config.md"


def _nested_structs(annotation: object) -> Iterator[type[msgspec.Struct]]:
    """Struct types inside an annotation, looking through Optional/Union and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        yield annotation
    elif typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            yield from _nested_structs(arg)


def config_keys(struct: type[msgspec.Struct], prefix: str = "") -> list[str]:
    """Every YAML key a config Struct accepts, nested ones as dotted paths (``queue.max_bytes``)."""
    keys = []
    for field in msgspec.structs.fields(struct):
        key = prefix + field.encode_name
        keys.append(key)
        for nested in _nested_structs(field.type):
            keys.extend(config_keys(nested, key + "."))
    return keys


def check_config_section(pattern: str, keys: list[str]) -> None:
    section = find_section(CONFIG_MD, pattern)
    rows = table_rows(section, "key")
    missing = [key for key in keys if key not in rows]
    assert not missing, f"docs/config.md, section {section.title!r}: keys not documented: {missing}"
    for key in keys:
        assert len(rows[key]) == 4 and rows[key][2], (
            f"docs/config.md, {section.title} {key}: the row needs key | type | default | meaning"
        )
    stale = sorted(set(rows) - set(keys))
    assert not stale, f"docs/config.md, section {section.title!r}: rows for keys that do not exist: {stale}"


CORE_SECTIONS = {
    "top level": (r"^Top level$", _RawConfig),  # the keys the YAML file's top level accepts
    "session": (r"^`session`$", SessionConfig),
    "pipeline": (r"^`pipeline`$", PipelineConfig),
    "probe": (r"^`probe`$", ProbeConfig),
    "overhead": (r"^`overhead`$", OverheadConfig),
    "statistics": (r"^`statistics`$", StatisticsConfig),
    "stacks": (r"^`stacks`$", StacksConfig),
    "every source": (r"^Keys every source has$", SourceConfig),
    "every sink": (r"^Keys every sink has$", SinkConfig),
}


@pytest.mark.parametrize("name", list(CORE_SECTIONS))
def test_core_config_keys_are_documented(name: str) -> None:
    pattern, struct = CORE_SECTIONS[name]
    keys = [k for k in config_keys(struct) if "." not in k] if struct is _RawConfig else config_keys(struct)
    check_config_section(pattern, keys)


COMPONENTS = [("source", n) for n in registry.available(registry.SOURCE_GROUP)] + [
    ("sink", n) for n in registry.available(registry.SINK_GROUP)
]


def _component_class(role: str, name: str) -> type:
    """The registered class, as the config loader finds it; a skip only when an optional
    third-party dependency of the component is missing (e.g. kafka-python for ``kafka``)."""
    try:
        return registry.source_class(name) if role == "source" else registry.sink_class(name)
    except ConfigError:
        pass  # the registry's message names the package; find out whether it is ours
    group = registry.SOURCE_GROUP if role == "source" else registry.SINK_GROUP
    (point,) = entry_points(group=group, name=name)
    try:
        return point.load()
    except ImportError as error:
        missing = error.name or ""
        if missing.split(".")[0] in ("cuptistream", "sources", "sinks"):
            pytest.fail(
                f"{role} {name!r} is registered as {point.value} but its module fails to import: {error}"
            )
        pytest.skip(f"{role} {name!r} needs the optional package {missing!r}, which is not installed")


@pytest.mark.parametrize(("role", "name"), COMPONENTS, ids=[f"{r}-{n}" for r, n in COMPONENTS])
def test_component_config_keys_are_documented(role: str, name: str) -> None:
    cls = _component_class(role, name)
    base = SourceConfig if role == "source" else SinkConfig
    shared = set(config_keys(base))  # documented once, in "Keys every source/sink has"
    keys = [k for k in config_keys(cls.config_type) if k not in shared]
    check_config_section(rf"^`{re.escape(name)}` {role}$", keys)


def test_every_documented_component_is_registered() -> None:
    documented = {
        (match.group(2), match.group(1))
        for s in sections(CONFIG_MD)
        if (match := re.match(r"^`([a-z_0-9]+)` (source|sink)$", s.title))
    }
    assert documented == set(COMPONENTS), (
        f"docs/config.md: undocumented components {sorted(set(COMPONENTS) - documented)}, "
        f"documented components that are not registered {sorted(documented - set(COMPONENTS))}"
    )


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A field missing from a section is caught (guards the markdown parsing itself)."""
    doc = tmp_path / "events.md"
    doc.write_text(
        "## Event types\n### Thing\n| field | type | unit | meaning |\n|---|---|---|---|\n"
        "| `a` | int | ns | A. |\n### Other\n| field | type | unit | meaning |\n|---|---|---|---|\n"
        "| `b` | int | ns | B. |\n",
        encoding="utf-8",
    )
    rows = table_rows(find_section(doc, r"^Thing$"), "field")
    assert set(rows) == {"a"}  # `b` belongs to the next section, not this one
    assert set(table_rows(find_section(doc, r"^Event types$"), "field")) == {"a", "b"}


def test_the_deploy_pages_collector_config_is_valid() -> None:
    """docs/deploy.md's collector configuration, merged into configs/production.yaml as the page
    says, is a config `cuptistream validate` accepts."""
    import yaml

    from cuptistream.config.model import build

    text = (DOCS / "deploy.md").read_text()
    (snippet,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    production = yaml.safe_load((DOCS.parent / "configs" / "production.yaml").read_text())
    config = build({**production, **yaml.safe_load(snippet)}, "docs/deploy.md")
    assert [sink.type for sink in config.sinks] == ["file", "kafka"]
