"""The CLI end to end, in real subprocesses: exit codes kept, drain on exit/exception/signals,
one-line errors. No GPU here, so sessions use the synthetic source (it touches no CUDA)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuptistream.events import Kernel
from cuptistream.recording.reader import read

CLI = [sys.executable, "-m", "cuptistream.cli"]


def _config(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        f"sources:\n  - {source}\n"
        f"sinks:\n  - {{type: file, directory: {tmp_path / 'out'}}}\n"
        "pipeline: {shutdown_deadline: 10s}\n"
    )
    return path


def _kernels(tmp_path: Path) -> list[Kernel]:
    return [e for e in read(tmp_path / "out") if isinstance(e, Kernel)]


def _drained(stderr: str) -> tuple[int, int]:
    match = re.search(r"drained: (\d+) events in; file: (\d+) delivered, (\d+) dropped", stderr)
    assert match, stderr
    return int(match.group(1)), int(match.group(3))


def test_run_keeps_the_exit_code_and_drains(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "{type: synthetic, events: 50000}")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 3, result.stderr
    events_in, dropped = _drained(result.stderr)
    assert events_in == 50_000 and dropped == 0
    assert len(_kernels(tmp_path)) == 50_000


def test_run_script_with_arguments_and_module_mode(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint('args', sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    cfg = _config(tmp_path, "{type: synthetic, events: 10}")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", str(script), "7", "x"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 7 and "args ['7', 'x']" in result.stdout
    (tmp_path / "mymod.py").write_text("print('module ran')\n")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", "-m", "mymod"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0 and "module ran" in result.stdout


def test_interpreter_flags_are_kept(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "{type: synthetic, events: 10}")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", "-u", "-c",
                             "import sys; print('unbuffered', sys.stdout.write_through)"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0 and "unbuffered True" in result.stdout, result.stderr


def test_version_output_option_and_config_from_the_environment(tmp_path: Path) -> None:
    version = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and re.fullmatch(r"cuptistream \S+\n", version.stdout), version.stdout
    cfg = _config(tmp_path, "{type: synthetic, events: 120}")
    env = {**os.environ, "CUPTISTREAM_CONFIG": str(cfg)}  # no -c: the variable names the config
    result = subprocess.run([*CLI, "run", "-o", str(tmp_path / "elsewhere"), "--quiet", "--", "python", "-c", "pass"],
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len([e for e in read(tmp_path / "elsewhere") if isinstance(e, Kernel)]) == 120
    assert not (tmp_path / "out").exists(), "-o must replace the config's directory"
    null_only = tmp_path / "null.yaml"
    null_only.write_text('sinks: [{type: "null"}]\n')
    refused = subprocess.run([*CLI, "run", "-c", str(null_only), "-o", "x", "--", "python", "-c", "print('ran')"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "ran" not in refused.stdout
    assert (
        refused.stderr.strip()
        == "cuptistream: run: -o/--output needs a file sink in the config; add one or leave -o out"
    )


def test_program_exception_exits_1_after_draining(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "{type: synthetic, events: 1000}")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", "-c", "raise ValueError('boom')"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "ValueError: boom" in result.stderr  # the program's own traceback, as python prints it
    assert _drained(result.stderr) == (1000, 0)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_drains_and_exits_with_the_signal_code(tmp_path: Path, signum: int, code: int) -> None:
    cfg = _config(tmp_path, "{type: synthetic, events: 0, rate: 20000, chunk_events: 500}")
    program = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n"
    proc = subprocess.Popen([*CLI, "run", "-c", str(cfg), "--", "python", "-c", program],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    events_in, dropped = _drained(stderr)
    assert events_in >= 10_000 and dropped == 0
    assert len(_kernels(tmp_path)) == events_in


@pytest.mark.parametrize(
    ("args", "needle", "code"),
    [
        (["run", "-c", "nonexistent.yaml", "--", "python", "-c", "pass"], "config file not found", 2),
        (["run", "-c", "configs/test-synthetic.yaml"], "no program given", 2),
        (
            ["run", "-c", "configs/test-synthetic.yaml", "--", "no-such-command-xyz"],
            "command 'no-such-command-xyz' not found",
            2,
        ),
        (["run", "-c", "configs/test-synthetic.yaml", "--", "python", "missing.py"], "not found", 2),
        (["run"], "run: no config; pass -c cfg.yaml or set CUPTISTREAM_CONFIG", 2),
        (["validate", "nonexistent.yaml"], "pass an existing YAML file as `cuptistream validate FILE`", 2),
        (["frobnicate"], "invalid choice", 2),
        (["cat", "does/not/exist"], "does/not/exist", 2),
    ],
)
def test_user_errors_are_one_line_without_traceback(args: list[str], needle: str, code: int) -> None:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=root)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and "Traceback" not in result.stderr


def test_unwritable_sink_fails_before_the_program_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"sinks: [{{type: file, directory: {blocker / 'sub'}}}]\n")
    result = subprocess.run([*CLI, "run", "-c", str(cfg), "--", "python", "-c", "print('ran')"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and "ran" not in result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_cat_prints_json_lines(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "{type: synthetic, events: 300}")
    subprocess.run(
        [*CLI, "run", "-c", str(cfg), "--quiet", "--", "python", "-c", "pass"], check=True, timeout=60
    )
    result = subprocess.run([*CLI, "cat", str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                            env={**os.environ})  # fmt: skip
    assert result.returncode == 0
    kernel_lines = [line for line in result.stdout.splitlines() if line.startswith('{"type":"kernel"')]
    assert len(kernel_lines) == 300


def test_default_config_without_gpu_disables_cupti_sources_and_keeps_the_program_running(
    tmp_path: Path,
) -> None:
    from conftest import HAVE_GPU

    if HAVE_GPU:
        pytest.skip("this machine has a GPU; the no-GPU path is what is tested here")
    from cuptistream.events import Error

    root = Path(__file__).resolve().parent.parent
    # The program tries CUDA (cuda.bindings' cuInit fails without a driver): its probe starts and
    # says why each source is off.
    program = (
        "from cuda.bindings import driver\ntry:\n    driver.cuInit(0)\nexcept Exception:\n    pass\n"
        "print('program ran'); raise SystemExit(3)"
    )
    result = subprocess.run([*CLI, "run", "-c", str(root / "configs/default.yaml"), "--", "python", "-c",
                             program], capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 3 and "program ran" in result.stdout
    assert "source 'activity' disabled: no NVIDIA driver found" in result.stderr
    assert "Traceback" not in result.stderr
    errors = [e for e in read(tmp_path / "cuptistream-out") if isinstance(e, Error)]
    assert {e.origin for e in errors} == {"source:activity", "source:state"}


def test_kinds_without_gpu_says_so_in_one_line() -> None:
    from conftest import HAVE_GPU

    if HAVE_GPU:
        pytest.skip("this machine has a GPU")
    result = subprocess.run([*CLI, "kinds"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "no NVIDIA driver" in result.stderr
