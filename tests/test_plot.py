"""``cuptistream plot``: each figure is a non-empty PNG, from the real-GPU fixtures and from a
recording without the data a figure needs; a missing matplotlib is one line."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from cuptistream.analysis.records import Recording
from cuptistream.analysis.select import Selection
from cuptistream.cli import main
from tests.helpers.fixture_recording import fixture_processes, write_recording

pytest.importorskip("matplotlib", reason="matplotlib is in the dev extra; CI installs it")

_PNG = b"\x89PNG\r\n\x1a\n"
_NAMES = ["gpu-busy.png", "top-kernels.png", "stall-reasons.png"]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_recording(tmp_path_factory.mktemp("rec") / "out", fixture_processes())


def _check_png(path: Path) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data.startswith(_PNG) and len(data) > 5000
    pixels = imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 500
    assert pixels.std() > 0.01  # something was drawn, not a blank canvas


def test_every_figure_is_a_png(recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(recording), "-o", str(tmp_path / "all"), "--bins", "50"]) == 0
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == _NAMES
    for name in _NAMES:
        _check_png(tmp_path / "all" / name)


def test_busy_timeline_adds_up_to_busy_time(recording: Path) -> None:
    from cuptistream.analysis.plot import BusyTimeline
    from cuptistream.analysis.summary import summarize

    sel = Selection(ranks=frozenset({2}))
    report = summarize(Recording(str(recording)), Selection(ranks=frozenset({2})), top=None)
    first, last = report.meta["first_unix_ns"], report.meta["last_unix_ns"]
    timeline = BusyTimeline(first, last, 37, sel)
    for part in Recording(str(recording)).parts():
        timeline.add(part)
    streams = {r["stream"]: r["busy_ns"] for r in report.table("stream_busy").as_dicts()}
    assert {key[2]: int(row.sum()) for key, row in timeline.busy.items()} == streams


def test_figures_without_their_data_still_say_so(recording: Path, tmp_path: Path) -> None:
    # rank 1 (graph_trace) has no kernels on a stream and no PC samples
    assert main(["plot", str(recording), "--rank", "1", "-o", str(tmp_path / "empty")]) == 0
    for name in _NAMES:
        _check_png(tmp_path / "empty" / name)


def test_missing_matplotlib_is_one_line(
    recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["plot", str(recording), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err == "cuptistream: plot needs matplotlib; install it with pip install 'cuptistream[plot]'\n"
    assert main(["plot", str(recording), "--bins", "0"]) == 2
