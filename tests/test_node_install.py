"""``cuptistream node install``: the start hook in a fresh virtualenv that has nothing of ours in it
(made with ``python -m venv --without-pip``), with real processes, a real node collector and real
files. There is no GPU here: the activity source's probe says so, as it does under ``run``; the
replay source stands in for CUDA work.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cuptistream
from cuptistream.events import Error, Kernel
from cuptistream.node.hook import HOOK_FILE
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES
from tests.helpers.node_collector import Collector, write_node_config

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "cuptistream.cli"]

# What a process can tell about itself: what a hook would leave behind.
INTROSPECT = r"""
import json, os, sys
print(json.dumps({
    "pid": os.getpid(),
    "threads": len(os.listdir("/proc/self/task")),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "modules": sorted(m for m in sys.modules if "cupti" in m),
    "meta_path": [type(f).__name__ for f in sys.meta_path],
    "path": sys.path,
}))
"""


def _tree(folder: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``folder``: its mode and its content's (or link's) digest."""
    entries = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            digest = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            digest = ""
        entries[str(path.relative_to(folder))] = (info.st_mode, digest)
    return entries


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=env)


class Venv:
    def __init__(self, folder: Path, node_root: Path) -> None:
        self.folder = folder
        self.python = str(folder / "bin" / "python")
        self.root = node_root
        self.before: dict[str, tuple[int, str]] = {}  # the venv's files before the install
        found = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        self.site_packages = Path(found.stdout.strip())

    def install(self) -> subprocess.CompletedProcess[str]:
        return _cli("node", "install", "--python", self.python, "--root", str(self.root))

    def uninstall(self) -> subprocess.CompletedProcess[str]:
        return _cli("node", "uninstall", "--python", self.python)

    def run(self, code: str, node_config: Path | str, **env: str) -> subprocess.CompletedProcess[str]:
        """``python -c code`` in the venv, with none of cuptistream's variables but the node config's."""
        clean = {
            k: v for k, v in os.environ.items() if not k.startswith("CUPTISTREAM_") and k != "PYTHONPATH"
        }
        clean.update(env, CUPTISTREAM_NODE_CONFIG=str(node_config))
        return subprocess.run(
            [self.python, "-c", code], capture_output=True, text=True, timeout=120, env=clean
        )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """One fresh venv with the hook installed, shared by this module's tests."""
    work = tmp_path_factory.mktemp("node")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    env = Venv(work / "venv", work / "node-root")
    subprocess.run([env.python, "-c", "pass"], check=True)  # whatever a first start writes, before
    env.before = _tree(env.folder)
    installed = env.install()
    assert installed.returncode == 0, installed.stderr
    yield env
    env.uninstall()


def _probe_config(path: Path, out: Path, source: dict[str, object], start: str) -> Path:
    cfg = {"sources": [source], "probe": {"start": start}, "sinks": [{"type": "file", "directory": str(out)}]}
    path.write_text(json.dumps(cfg))
    return path


def _untouched(facts: dict[str, object], venv: Venv) -> None:
    assert facts["threads"] == 1
    assert facts["fds"] == [0, 1, 2, 3]  # 3: the listing of /proc/self/fd itself
    assert facts["modules"] == []
    assert "PostImportHooks" not in facts["meta_path"]
    assert not any(str(venv.root) in p for p in facts["path"])


def test_install_adds_one_hook_file_and_a_runtime_outside_the_venv(venv: Venv) -> None:
    after = _tree(venv.folder)
    added = set(after) - set(venv.before)
    assert {Path(p).name for p in added} == {HOOK_FILE}
    assert not set(venv.before) - set(after)
    hook = (venv.site_packages / HOOK_FILE).read_text()
    assert hook.count("\n") == 1 and hook.startswith("import ")
    runtimes = list((venv.root / "python").iterdir())
    assert len(runtimes) == 1 and (runtimes[0] / "cuptistream" / "probe" / "probe.py").is_file()
    status = _cli("node", "status", "--python", venv.python)
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"hook: {venv.site_packages / HOOK_FILE}" in status.stdout and "(present)" in status.stdout


@pytest.mark.parametrize("node_config", ["absent", "empty variable"])
def test_without_a_node_config_a_process_starts_untouched(
    venv: Venv, tmp_path: Path, node_config: str
) -> None:
    where = str(tmp_path / "node.yaml") if node_config == "absent" else ""
    done = venv.run(INTROSPECT, where)
    assert done.returncode == 0 and done.stderr == ""
    _untouched(json.loads(done.stdout), venv)


def test_with_a_node_config_the_trigger_waits_for_cuda_and_starts_nothing(venv: Venv, tmp_path: Path) -> None:
    """``start: cuda``: a process that never initializes CUDA gets an import hook and nothing
    else, exactly as under ``cuptistream run``: no thread, no socket, no file, no cuptistream."""
    probes = _probe_config(tmp_path / "probes.json", tmp_path / "out", {"type": "activity"}, "cuda")
    node = write_node_config(tmp_path / "node.yaml", tmp_path / "c.sock", probes, "cuda")
    done = venv.run(INTROSPECT, node)
    assert done.returncode == 0 and done.stderr == ""
    facts = json.loads(done.stdout)
    assert facts["meta_path"][0] == "PostImportHooks"
    assert facts["threads"] == 1 and facts["fds"] == [0, 1, 2, 3]
    assert facts["modules"] == ["_cuptistream_import_hooks", "_cuptistream_node", "_cuptistream_trigger"]
    assert facts["path"][-1] == str(venv.root.resolve() / "hook")  # the runtime only once the trigger fires


def test_a_plain_python_in_the_venv_is_recorded_by_the_node_collector(venv: Venv, tmp_path: Path) -> None:
    probes = _probe_config(
        tmp_path / "probes.json", tmp_path / "out",
        {"type": "replay", "path": str(CAPTURES / "exact_counts.cupti"), "loops": 1}, "process",
    )  # fmt: skip
    socket_path = tmp_path / "c.sock"
    node = write_node_config(tmp_path / "node.yaml", socket_path, probes, "process")
    collector = Collector(probes, socket_path, tmp_path / "report.json")
    try:
        status = _cli("node", "status", env={**os.environ, "CUPTISTREAM_NODE_CONFIG": str(node)})
        assert status.returncode == 0, status.stdout
        assert f"collector: {socket_path} reachable" in status.stdout
        done = venv.run(INTROSPECT, node, RANK="3", WORLD_SIZE="4", SLURM_JOB_ID="4242")
    finally:
        report = collector.stop()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    pid = json.loads(done.stdout)["pid"]
    assert report["probes"] == 1 and report["activity_records"] > 0
    batches = list(cuptistream.read(tmp_path / "out").batches())
    mine = [b for b in batches if b.resource.pid == pid]
    assert mine, [b.resource.pid for b in batches]
    resource = mine[0].resource
    assert (resource.rank, resource.world_size) == (3, 4)
    assert resource.job.get("SLURM_JOB_ID") == "4242"
    kernels = sum(isinstance(e, Kernel) for b in mine for e in b.events)
    expected = json.loads((ROOT / "tests" / "fixtures" / "expected.json").read_text())["exact_counts"]
    assert kernels == sum(expected["kernel_names"].values())


def test_without_a_gpu_the_probe_says_so_to_the_collector_and_the_program_runs_on(
    venv: Venv, tmp_path: Path
) -> None:
    probes = _probe_config(tmp_path / "probes.json", tmp_path / "out", {"type": "activity"}, "process")
    socket_path = tmp_path / "c.sock"
    node = write_node_config(tmp_path / "node.yaml", socket_path, probes, "process")
    collector = Collector(probes, socket_path, tmp_path / "report.json")
    try:
        done = venv.run("print('ran')", node)
    finally:
        report = collector.stop()
    assert done.returncode == 0 and done.stdout == "ran\n"
    assert report["probes"] == 1
    errors = [e for e in cuptistream.read(tmp_path / "out") if isinstance(e, Error)]
    assert any(e.origin == "source:activity" and "no NVIDIA driver" in e.message for e in errors), errors
    assert "source 'activity' disabled: no NVIDIA driver" in done.stderr


def test_with_the_collector_stopped_a_process_runs_without_a_word(venv: Venv, tmp_path: Path) -> None:
    probes = _probe_config(tmp_path / "probes.json", tmp_path / "out", {"type": "replay"}, "process")
    node = write_node_config(tmp_path / "node.yaml", tmp_path / "gone.sock", probes, "process")
    done = venv.run(INTROSPECT, node)
    assert done.returncode == 0 and done.stderr == ""
    facts = json.loads(done.stdout)
    assert facts["threads"] == 1 and facts["fds"] == [0, 1, 2, 3]
    assert not any(m.startswith("cuptistream") for m in facts["modules"])
    assert not (tmp_path / "out").exists()
    status = _cli("node", "status", env={**os.environ, "CUPTISTREAM_NODE_CONFIG": str(node)})
    assert "not reachable" in status.stdout


def test_an_invalid_node_config_is_one_line_in_the_process_and_in_status(venv: Venv, tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("collector: relative.sock\nconfig: /etc/x.yaml\n")
    done = venv.run("print('ran')", node)
    assert done.returncode == 0 and done.stdout == "ran\n"
    assert done.stderr.count("\n") == 1 and "collector must be an absolute path" in done.stderr
    status = _cli("node", "status", env={**os.environ, "CUPTISTREAM_NODE_CONFIG": str(node)})
    assert status.returncode == 1
    assert "problem: node config" in status.stdout and "absolute path" in status.stdout
    node.write_text("collector: /run/c.sock\nconfig: /etc/x.yaml\nstart: sometimes\n")
    done = venv.run("print('ran')", node)
    assert "start must be cuda or process" in done.stderr and done.stdout == "ran\n"


def test_under_cuptistream_run_the_node_hook_steps_aside(venv: Venv, tmp_path: Path) -> None:
    probes = _probe_config(tmp_path / "probes.json", tmp_path / "out", {"type": "replay"}, "process")
    node = write_node_config(tmp_path / "node.yaml", tmp_path / "c.sock", probes, "process")
    done = venv.run(INTROSPECT, node, CUPTISTREAM_COLLECTOR="/somewhere/else.sock")
    assert done.returncode == 0 and done.stderr == ""
    assert "_cuptistream_node" not in json.loads(done.stdout)["modules"]


def _fake_python(path: Path, implementation: str, version: list[int]) -> str:
    facts = {"implementation": implementation, "version": version, "soabi": "x", "platform": "linux-x86_64",
             "executable": str(path), "prefix": "/", "purelib": str(path.parent), "site_packages": []}  # fmt: skip
    path.write_text(f"#!/bin/sh\necho '{json.dumps(facts)}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["install", "--python", "/nonexistent/python"], "cannot run /nonexistent/python"),
        (["install"], "no environment given; pass --python PATH or --site-packages DIR"),
        (["install", "--site-packages", "/nonexistent"], "/nonexistent is not a folder"),
        (["install", "--site-packages", "/tmp"], "cannot tell which Python uses /tmp"),
        (["install", "--python", sys.executable, "--site-packages", "/tmp"], "is not a site-packages folder"),
        (["install", "--python", "/bin/true"], "is not a Python this can inspect"),
        (["install", "--python", "{old}"], "cpython 3.9 ({old}) is not supported"),
        (["install", "--python", "{pypy}"], "pypy 3.11 ({pypy}) is not supported"),
        (["uninstall", "--python", "/nonexistent/python"], "cannot run /nonexistent/python"),
    ],
)
def test_user_errors_are_one_line_with_a_fix(tmp_path: Path, args: list[str], expected: str) -> None:
    fakes = {"old": _fake_python(tmp_path / "python3.9", "cpython", [3, 9]),
             "pypy": _fake_python(tmp_path / "pypy3", "pypy", [3, 11])}  # fmt: skip
    args = [a.format(**fakes) for a in args]
    done = _cli("node", *args, "--root", str(tmp_path / "root"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("cuptistream: node")
    assert expected.format(**fakes) in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "root").exists()


def test_a_foreign_file_of_the_hooks_name_is_never_overwritten(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    python = str(tmp_path / "v" / "bin" / "python")
    site = Venv(tmp_path / "v", tmp_path / "root").site_packages
    (site / HOOK_FILE).write_text("import something_else\n")
    done = _cli("node", "install", "--python", python, "--root", str(tmp_path / "root"))
    assert done.returncode == 2 and "is not a cuptistream node hook; move it away" in done.stderr
    assert (site / HOOK_FILE).read_text() == "import something_else\n"


def test_uninstall_leaves_the_venv_byte_identical_and_removes_the_runtime(venv: Venv) -> None:
    done = venv.uninstall()
    assert done.returncode == 0, done.stderr
    assert _tree(venv.folder) == venv.before
    assert not venv.root.exists()  # the last environment that used it: runtime and hook modules gone
    again = venv.uninstall()
    assert again.returncode == 0 and "nothing to remove" in again.stdout
    reinstalled = venv.install()  # as the module's fixture left it
    assert reinstalled.returncode == 0, reinstalled.stderr
