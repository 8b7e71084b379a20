"""The files in ``deploy/``, checked as far as a machine without systemd running, Kubernetes or Slurm
allows: the unit with ``systemd-analyze verify``, the manifests against the Kubernetes schemas
(``kubernetes-validate``, offline), the configs they carry with cuptistream's own loaders, and the
Slurm prolog and epilog by running them around two jobs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cuptistream import cli
from cuptistream.config import load
from cuptistream.probe.boot._cuptistream_node import read_node_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "cuptistream-collector.service"
CUPTISTREAM = str(Path(sys.executable).parent / "cuptistream")


def _unit_exec_start() -> list[str]:
    lines = [line for line in UNIT.read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1
    return shlex.split(lines[0].removeprefix("ExecStart="))


def _collector_args(argv: list[str]) -> dict[str, Any]:
    """The collector command line as cuptistream's own parser reads it."""
    assert Path(argv[0]).name == "cuptistream"
    return vars(cli._parser().parse_args(argv[1:]))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this environment's cuptistream.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(_unit_exec_start()[0], CUPTISTREAM))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_unit_and_the_node_config_agree() -> None:
    args = _collector_args(_unit_exec_start())
    node = read_node_config(str(DEPLOY / "node.yaml"))
    assert args["command"] == "collector" and args["socket"] == node["collector"]
    assert args["config"] == node["config"] and args["socket_mode"] == 0o666


def _manifest() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()) if doc]


def test_the_kubernetes_manifests_validate_against_the_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    documents = _manifest()
    assert [d["kind"] for d in documents] == ["Namespace", "ConfigMap", "DaemonSet"]
    for document in documents:  # raises ValidationError, naming the path, if one does not
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_the_daemonset_runs_the_collector_on_the_configs_it_mounts(tmp_path: Path) -> None:
    config_map, daemonset = _manifest()[1:]
    (tmp_path / "node.yaml").write_text(config_map["data"]["node.yaml"])
    (tmp_path / "collector.yaml").write_text(config_map["data"]["collector.yaml"])
    node = read_node_config(str(tmp_path / "node.yaml"))
    config = load(tmp_path / "collector.yaml")
    assert [s.type for s in config.sources] == ["activity"] and config.probe.start == node["start"]
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = _collector_args(container["command"])
    assert (args["socket"], args["config"]) == (node["collector"], node["config"])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[str(Path(args["socket"]).parent)]]["hostPath"]["path"] == "/run/cuptistream"
    assert pod["hostPID"] is True and "SYS_PTRACE" in container["securityContext"]["capabilities"]["add"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]  # a GPU would be taken from the jobs
    assert container["resources"]["limits"]["memory"] == "1Gi"


def _slurm(script: str, job: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DEPLOY / "slurm" / script)], env={**env, "SLURM_JOB_ID": str(job)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.slow  # several seconds: scripts/test.sh --all (CI) runs it
@pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")
def test_the_slurm_prolog_and_epilog_run_the_collector_for_the_jobs_on_a_node(tmp_path: Path) -> None:
    config = tmp_path / "collector.yaml"
    config.write_text(
        f"sources:\n  - type: replay\nprobe:\n  start: cuda\nsinks:\n  - type: file\n    directory: {tmp_path / 'out'}\n"
    )
    state, node_config = tmp_path / "run", tmp_path / "etc" / "node.yaml"
    env = {**os.environ, "CUPTISTREAM": CUPTISTREAM, "CUPTISTREAM_COLLECTOR_CONFIG": str(config),
           "CUPTISTREAM_STATE_DIR": str(state), "CUPTISTREAM_NODE_CONFIG": str(node_config)}  # fmt: skip
    pid = 0
    try:
        first = _slurm("prolog.sh", 11, env)
        assert first.returncode == 0 and first.stderr == "", first.stderr
        pid = int((state / "collector.pid").read_text())
        assert _alive(pid) and (state / "collector.sock").is_socket()
        assert read_node_config(str(node_config))["collector"] == str(state / "collector.sock")
        status = subprocess.run([CUPTISTREAM, "node", "status"], env=env, capture_output=True, text=True)
        assert f"collector: {state / 'collector.sock'} reachable" in status.stdout, status.stdout
        assert _slurm("prolog.sh", 12, env).returncode == 0
        assert int((state / "collector.pid").read_text()) == pid  # one collector for both jobs
        assert _slurm("epilog.sh", 11, env).returncode == 0
        assert _alive(pid) and node_config.exists()  # job 12 still runs
        last = _slurm("epilog.sh", 12, env)
        assert last.returncode == 0 and last.stderr == "", last.stderr
        assert not _alive(pid) and not node_config.exists()
        assert list((tmp_path / "out").iterdir())  # it drained and closed its files
    finally:  # a failed check must not leave a collector behind
        if not pid and (state / "collector.pid").exists():
            pid = int((state / "collector.pid").read_text())
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
