"""Config loading: every shipped config validates; malformed configs give one line naming the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuptistream.config import load
from cuptistream.config.units import parse_duration, parse_size
from cuptistream.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    names = {p.name for p in CONFIGS}
    assert {"default.yaml", "test-synthetic.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    config = load(path)
    assert config.sinks, f"{path.name} has no sink"
    assert all(s.name for s in config.sinks)


def test_sizes_and_durations() -> None:
    assert parse_size("10MiB") == 10 * 1024 * 1024
    assert parse_size("10MB") == 10_000_000
    assert parse_size(4096) == 4096
    assert parse_size("1.5KiB") == 1536
    assert parse_duration("500ms") == pytest.approx(0.5)
    assert parse_duration("2min") == 120
    assert parse_duration(3) == 3.0
    config = load({"pipeline": {"memory_budget": "1GiB", "batch": {"max_latency": "250ms"}},
                   "sinks": [{"type": "null"}]})  # fmt: skip
    assert config.pipeline.memory_budget == 1 << 30
    assert config.pipeline.batch.max_latency == pytest.approx(0.25)


NULL = {"type": "null"}
MALFORMED: list[tuple[object, str]] = [
    ({"sinks": [NULL, {"type": "null", "batch": {"max_bytes": "10 potatoes"}}]}, "sinks[1].batch.max_bytes: "),
    ({"sinks": [NULL, {"type": "null", "batch": {"max_events": "many"}}]}, 'sinks[1].batch.max_events: expected int, got "many"'),
    ({"sinks": [{"type": "null", "colour": "red"}]}, "sinks[0].colour: unknown key"),
    ({"sinks": [{"type": "nope"}]}, "sinks[0].type: unknown sink 'nope'"),
    ({"sinks": [{"name": "x"}]}, "sinks[0].type: required key is missing"),
    ({"sinks": ["file"]}, 'sinks[0]: expected a mapping, got "file"'),
    ({"sinks": []}, "sinks: no sink is enabled"),
    ({"sinks": [NULL], "pipeline": {"full_policy": "panic"}}, 'pipeline.full_policy: "panic" is not one of block, drop_newest, drop_oldest'),
    ({"sinks": [NULL], "pipeline": {"decode_workers": "many"}}, 'pipeline.decode_workers: "many" is not auto or a whole number'),
    ({"sinks": [NULL], "pipeline": {"memory_budget": -5}}, "pipeline.memory_budget: "),
    ({"sinks": [NULL], "pipeline": {"memory_budget": "lots"}}, "pipeline.memory_budget: expected a size"),
    ({"sinks": [NULL], "pipeline": {"stats_interval": "soon"}}, "pipeline.stats_interval: expected a duration"),
    ({"sinks": [NULL], "pipeline": {"shutdown_deadline": True}}, "pipeline.shutdown_deadline: "),
    ({"sinks": [NULL], "pipeline": {"batch": []}}, "pipeline.batch: expected a mapping"),
    ({"sinks": [NULL], "pipelines": {}}, "pipelines: unknown key"),
    ({"sinks": [NULL], "session": {"attributes": {"team": ["a"]}}}, "session.attributes.team: expected str"),
    ({"sinks": [NULL], "session": {"job_env": "RANK"}}, "session.job_env: expected a list"),
    ({"sinks": [NULL], "sources": [{"type": "synthetic", "rate": "fast"}]}, 'sources[0].rate: expected float, got "fast"'),
    ({"sinks": [NULL], "sources": [{"type": "warp"}]}, "sources[0].type: unknown source 'warp'"),
    ({"sinks": [NULL], "sources": [{"type": "synthetic", "evnts": 5}]}, "sources[0].evnts: unknown key"),
    ({"sinks": [NULL, NULL]}, "sinks[1].name: 'null' is already used by sinks[0]"),
    ({"sinks": [{"type": "null", "queue": {"full_policy": "wait"}}]}, 'sinks[0].queue.full_policy: "wait" is not one of block, drop_newest, drop_oldest'),
    ({"sinks": [{"type": "null", "queue": {"max_bytes": [1]}}]}, "sinks[0].queue.max_bytes: expected a size"),
    ({"sinks": [{"type": "file", "directory": 7}]}, "sinks[0].directory: expected str, got 7"),
    ({"sinks": [NULL], "sources": [{"type": "synthetic", "enabled": "yes"}]}, 'sources[0].enabled: expected bool, got "yes"'),
    ("just a string", "<top level>: expected a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "expected"), MALFORMED, ids=[m[1][:40] for m in MALFORMED])
def test_malformed_config_gives_one_line_naming_the_path(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from cuptistream.config import build

        build(data)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("sinks:\n  - type: file\n    directory: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert "line" in str(caught.value)


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("sinks: [{type: file, batch: {max_bytes: 10 MB}}]\n", "sinks[0].batch.max_bytes"),
        ("sinks: [{type: null}]\npipeline: {full_policy: sometimes}\n", "pipeline.full_policy"),
    ],
)
def test_validate_cli_prints_one_line_and_exits_2(tmp_path: Path, yaml_text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text.replace("10 MB", "10 potatoes"))
    result = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "validate", str(path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr


VALUES_THAT_DO_HARM = [
    ("pipeline: {stats_interval: .nan}", "pipeline.stats_interval: expected a finite duration, got nan"),
    ("pipeline: {stats_interval: 0}", "pipeline: stats_interval must be at least 10ms, got 0s"),
    (
        "pipeline: {batch: {max_latency: .inf}}",
        "pipeline.batch.max_latency: expected a finite duration, got inf",
    ),
    (
        "pipeline: {shutdown_deadline: .nan}",
        "pipeline.shutdown_deadline: expected a finite duration, got nan",
    ),
    ("pipeline: {shutdown_deadline: 0}", "pipeline: shutdown_deadline must be more than 0, got 0"),
    ("pipeline: {memory_budget: 0}", "pipeline: memory_budget must be at least 1, got 0"),
    ("pipeline: {batch: {max_events: -1}}", "pipeline.batch: max_events must be at least 1, got -1"),
    (
        "pipeline: {memory_budget: 99999999999999999999TiB}",
        "pipeline.memory_budget: size '99999999999999999999TiB' is too large",
    ),
    (
        "pipeline: {memory_budget: '" + "9" * 400 + "'}",
        "pipeline.memory_budget: expected a size like 10MiB or 65536, got '999",
    ),
    ("probe: {event_buffers: 1}", "probe: event_buffers must be at least 2"),
]


@pytest.mark.parametrize(
    ("entry", "expected"), VALUES_THAT_DO_HARM, ids=[v[0][:40] for v in VALUES_THAT_DO_HARM]
)
def test_values_that_would_do_harm_are_refused_in_one_line(tmp_path: Path, entry: str, expected: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(f'{entry}\nsinks: [{{type: "null", queue: {{max_bytes: 1MiB}}}}]\n')
    result = subprocess.run([sys.executable, "-m", "cuptistream.cli", "validate", str(path)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cuptistream: {expected}"), result.stderr
    assert len(lines[0]) < 200


def test_a_sink_queue_of_zero_bytes_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^sinks\[0\]\.queue: max_bytes must be at least 1, got 0$"):
        load({"sinks": [{"type": "null", "queue": {"max_bytes": 0}}]})


def _bomb() -> str:
    """A 400-byte YAML whose aliases expand to 9**9 strings."""
    lines = ['x0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return (
        "session:\n  attributes:\n"
        + "\n".join("    " + line for line in lines)
        + '\nsinks: [{type: "null"}]\n'
    )


LOADING_DEFECTS = [
    (
        b'sinks: [{type: "null"}]\nsinks: [{type: file}]\n',
        "duplicate key 'sinks' (keep one) at line 2, column 1",
    ),
    (b'sinks: [{type: "null", name: a, name: b}]\n', "duplicate key 'name' (keep one) at line 1"),
    (b'sinks: [{type: "null"}]\n# \xff\xfe\n', "not UTF-8 text (byte 26); save the config as UTF-8"),
    (("a: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested too deeply to be a config"),
    (_bomb().encode(), "expands to more than 100000 values (YAML aliases); write the values out"),
    (b'sinks: [{type: "null", "bad\\nkey": 1}]\n', "sinks[0].bad\\nkey: unknown key"),
    (b"sinks: [{type: null}]\n", 'sinks[0].type: is empty; for the null sink write `type: "null"` (quoted)'),
]


@pytest.mark.parametrize(("content", "expected"), LOADING_DEFECTS, ids=[d[1][:30] for d in LOADING_DEFECTS])
def test_files_that_are_not_configs_are_refused_in_one_line(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "cuptistream.cli", "validate", str(path)],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr, result.stderr


COMPONENT_NUMBERS_THAT_CANNOT_WORK = [
    ({"sources": [{"type": "synthetic", "rate": float("nan")}]}, "sources[0]: rate must be at least 0, got nan"),
    ({"sources": [{"type": "synthetic", "chunk_events": 0}]}, "sources[0]: chunk_events must be at least 1, got 0"),
    ({"sources": [{"type": "synthetic", "events": -1}]}, "sources[0]: events must be at least 0, got -1"),
    ({"sources": [{"type": "callbacks", "max_buffered": 0}]}, "sources[0]: max_buffered must be at least 1, got 0"),
    ({"sources": [{"type": "callbacks", "flush_interval": 0}]}, "sources[0]: flush_interval must be more than 0, got 0"),
    ({"sources": [{"type": "activity", "device_buffer_pool_limit": -3}]},
     "sources[0]: device_buffer_pool_limit must be at least 1, got -3"),
    ({"sources": [{"type": "sass", "windows": -1}]}, "sources[0]: windows must be at least 0, got -1"),
    ({"sources": [{"type": "sass", "period": 0}]}, "sources[0]: period must be more than 0, got 0"),
    ({"probe": {"memory_budget": 0}}, "probe: memory_budget must be at least 1, got 0"),
    ({"probe": {"standby_retry": 0}}, "probe: standby_retry must be at least 0.05, got 0"),
    ({"probe": {"standby_retry": float("nan")}}, "probe.standby_retry: expected a finite duration, got nan"),
    ({"sinks": [{"type": "null", "connect_timeout": 0}]}, "sinks[0]: connect_timeout must be more than 0, got 0"),
    ({"sinks": [{"type": "null", "connect_timeout": float("inf")}]},
     "sinks[0].connect_timeout: expected a finite duration, got inf"),
    ({"sinks": [{"type": "otlp", "endpoint": "http://127.0.0.1:4318", "retry": {"multiplier": float("inf")}}]},
     "sinks[0].retry: multiplier must be at least 1, got inf"),
    ({"sinks": [{"type": "otlp", "endpoint": "http://127.0.0.1:4318", "max_pending_spans": 0}]},
     "sinks[0]: max_pending_spans: must be positive"),
    ({"statistics": {"interval": 0}}, "statistics: interval must be between 100ms and 1h, got 0s"),
    ({"statistics": {"interval": "2h"}}, "statistics: interval must be between 100ms and 1h, got 7200s"),
    ({"statistics": {"interval": "soon"}}, "statistics.interval: expected a duration like 500ms or 2s, got 'soon'"),
    ({"statistics": {"max_names": 0}}, "statistics: max_names must be at least 1, got 0"),
    ({"statistics": {"enabled": "yes please"}}, 'statistics.enabled: expected bool, got "yes please"'),
    ({"statistics": {"interval_s": 10}}, "statistics.interval_s: unknown key (known keys: enabled, interval, max_names, max_stacks)"),
    ({"statistics": {"max_stacks": 0}}, "statistics: max_stacks must be at least 1, got 0"),
    ({"statistics": [10]}, "statistics: expected a mapping, got [10]"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "expected"), COMPONENT_NUMBERS_THAT_CANNOT_WORK,
                         ids=[e[1][:40] for e in COMPONENT_NUMBERS_THAT_CANNOT_WORK])  # fmt: skip
def test_component_numbers_that_cannot_work_are_refused(data: dict, expected: str) -> None:
    config = {"sinks": [{"type": "null"}], **data}
    with pytest.raises(ConfigError) as info:
        load(config)
    assert str(info.value) == expected


def test_statistics_are_on_by_default_and_configurable() -> None:
    default = load({"sinks": [{"type": "null"}]}).statistics
    assert (default.enabled, default.interval_ns, default.max_names) == (True, 10_000_000_000, 500)
    chosen = load(
        {"sinks": [{"type": "null"}], "statistics": {"interval": "500ms", "max_names": 20}}
    ).statistics
    assert (chosen.interval_ns, chosen.max_names) == (500_000_000, 20)
    assert not load({"sinks": [{"type": "null"}], "statistics": {"enabled": False}}).statistics.enabled
