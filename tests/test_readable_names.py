"""Views show demangled names by default, raw ones with ``--mangled``; the recording keeps the raw ones."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import msgspec
import pytest

from cuptistream import events as ev
from cuptistream.cli import main
from cuptistream.recording.reader import read
from tests.helpers.fixture_recording import (  # noqa: F401 - the fixtures
    Process,
    processes_fixture,
    recording_fixture,
    write_recording,
)

_MANGLED = re.compile(r"(?<![A-Za-z0-9_])_Z[A-Za-z0-9_]+")


def test_summary_demangles_by_default(recording: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("table", "json", "csv"):
        assert main(["summary", str(recording), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert not _MANGLED.search(out), (fmt, _MANGLED.search(out))
    report = json.loads(_out(capsys, ["summary", str(recording), "--format", "json"]))
    names = [r["name"] for r in report["kernels"]["rows"]]
    assert any(n.startswith("void cutlass::Kernel2<") for n in names)
    assert any(n.startswith("void at::native::") for n in names)
    assert all(not r["function"].startswith("_Z") for r in report["pc_functions"]["rows"])


def test_summary_mangled_shows_recorded_names(recording: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads(_out(capsys, ["summary", str(recording), "--format", "json", "--mangled"]))
    names = {r["name"] for r in report["kernels"]["rows"]}
    recorded = {e.name for e in read(recording) if isinstance(e, ev.Kernel)}
    assert names == recorded  # the recording keeps the mangled names
    assert any(n.startswith("_Z") for n in names)


def test_carried_demangled_name_is_used(
    tmp_path: Path, processes: list[Process], capsys: pytest.CaptureFixture[str]
) -> None:
    """A kernel recorded with demangle: true shows its demangled_name as it is, in every view."""
    process = processes[2]
    marked = [
        msgspec.structs.replace(e, demangled_name=f"shown {e.name[:8]}") if isinstance(e, ev.Kernel) else e
        for e in process.events
    ]
    directory = write_recording(tmp_path / "rec", [Process(process.resource, process.clock, marked)])
    report = json.loads(_out(capsys, ["summary", str(directory), "--format", "json"]))
    assert all(r["name"].startswith("shown ") for r in report["kernels"]["rows"])
    trace = tmp_path / "t.json"
    assert main(["export", str(directory), "-o", str(trace)]) == 0
    kernels = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"}
    assert kernels and all(n.startswith("shown ") for n in kernels)
    compared = json.loads(_out(capsys, ["compare", str(directory), "--format", "json"]))
    assert all(n.startswith("shown ") for n in compared["total"]["top_kernels"])


def test_export_demangles(recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json.gz"
    assert main(["export", str(recording), "-o", str(trace)]) == 0
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    kernels = {e["name"] for e in events if e.get("cat") == "kernel"}
    assert kernels and not any(n.startswith("_Z") for n in kernels)
    assert main(["export", str(recording), "-o", str(trace), "--mangled"]) == 0
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    assert any(e["name"].startswith("_Z") for e in events if e.get("cat") == "kernel")


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out
