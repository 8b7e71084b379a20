"""GPU acceptance for every process of a job. Runs on a host with two GPUs.

- torchrun with two DDP ranks under ``cuptistream run``: one file set per rank, with that rank's
  device UUID, its NCCL kernels, and the same kernel count as torch.profiler on a second run of the
  same deterministic script;
- multiprocessing spawn with four CPU-only workers and one CUDA worker: one process's GPU data;
- one process on two GPUs: both devices in its envelope;
- a compiled CUDA program: the one-line note, and its exit status.

With ``CUPTISTREAM_GPU_RESULTS=DIR`` each test also writes what it measured to ``DIR/*.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import cuptistream
from cuptistream.events import Kernel

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs" / "default.yaml"
CLI = [sys.executable, "-m", "cuptistream.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _gpus() -> int:
    torch = pytest.importorskip("torch")
    return int(torch.cuda.device_count())


def _record(name: str, data: dict[str, Any]) -> None:
    if results := os.environ.get("CUPTISTREAM_GPU_RESULTS"):
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / f"{name}.json").write_text(json.dumps(data, indent=1))


def _run(
    tmp_path: Path, command: list[str], timeout: int = 400
) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [*CLI, "run", "-c", str(DEFAULT), "-o", str(tmp_path / "out"), "--report-json", str(report), "--",
         *command],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return result, (json.loads(report.read_text()) if report.exists() else {})


def _torchrun() -> list[str]:
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def test_torchrun_two_ranks_one_file_set_each_matching_torch_profiler(tmp_path: Path) -> None:
    if _gpus() < 2:
        pytest.skip("needs two GPUs")
    script = [str(ROOT / "examples" / "train_ddp.py"), "--steps", "50"]
    ours = tmp_path / "ours"
    result, report = _run(tmp_path, [*_torchrun(), "--nproc_per_node=2", *script, "--out", str(ours)])
    assert result.returncode == 0, result.stderr[-3000:]
    kineto = tmp_path / "kineto"
    profiled = subprocess.run(
        [*_torchrun(), "--nproc_per_node=2", *script, "--profile", "--out", str(kineto)],
        cwd=ROOT, env={k: v for k, v in _env().items() if not k.startswith("CUPTISTREAM")},
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr[-3000:]

    assert report["probes"] == 2, "torchrun's own process never initializes CUDA; each rank does"
    measured: dict[str, Any] = {"report": report, "ranks": {}}
    out = tmp_path / "out"
    for rank in (0, 1):
        truth = json.loads((ours / f"rank{rank}.json").read_text())
        reference = json.loads((kineto / f"rank{rank}.json").read_text())
        files = sorted(out.glob(f"cuptistream-rank{rank}-*"))
        assert files, f"no file set for rank {rank}: {sorted(p.name for p in out.iterdir())}"
        batches = [b for f in files for b in cuptistream.read(f).batches()]
        assert {b.resource.pid for b in batches} == {truth["pid"]}
        assert {(b.resource.rank, b.resource.local_rank, b.resource.world_size) for b in batches} == {
            (rank, rank, 2)
        }
        uuids = {d.uuid for b in batches for d in b.resource.devices}
        assert uuids == {truth["device_uuid"]}, f"rank {rank}: {uuids} vs {truth['device_uuid']}"
        kernels = Counter(e.name for b in batches for e in b.events if isinstance(e, Kernel))
        nccl = sum(n for name, n in kernels.items() if "nccl" in name.lower())
        devices = {e.device_id for b in batches for e in b.events if isinstance(e, Kernel)}
        measured["ranks"][rank] = {
            "pid": truth["pid"], "device_uuid": truth["device_uuid"], "files": [f.name for f in files],
            "kernels": sum(kernels.values()), "nccl_kernels": nccl, "kineto_kernels": reference["kineto_kernels"],
            "kernel_devices": sorted(devices),
            "by_name_differences": {
                name: [kernels.get(name, 0), reference["kineto_by_name"].get(name, 0)]
                for name in set(kernels) | set(reference["kineto_by_name"])
                if kernels.get(name, 0) != reference["kineto_by_name"].get(name, 0)
            },
        }  # fmt: skip
    _record("torchrun_two_ranks", measured)
    for rank, seen in measured["ranks"].items():
        assert seen["nccl_kernels"] > 0, f"rank {rank}: no NCCL kernels"
        assert seen["kernel_devices"] == [rank]
        assert seen["kernels"] == seen["kineto_kernels"], f"rank {rank}: {seen['by_name_differences']}"


def test_spawn_four_cpu_workers_and_one_cuda_worker(tmp_path: Path) -> None:
    _gpus()
    result, report = _run(tmp_path, [sys.executable, str(ROOT / "examples" / "spawn_workers.py")])
    assert result.returncode == 0, result.stderr[-3000:]
    workers = [line.split() for line in result.stdout.splitlines()]
    cuda_pid = next(int(pid) for kind, pid, _ in workers if kind == "cuda")
    cpu_pids = {int(pid) for kind, pid, _ in workers if kind == "cpu"}
    by_pid: Counter[int] = Counter()
    for batch in cuptistream.read(tmp_path / "out").batches():
        by_pid[batch.resource.pid] += sum(isinstance(e, Kernel) for e in batch.events)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    _record("spawn_workers", {"report_probes": report["probes"], "kernels_by_pid": by_pid, "files": files,
                              "cuda_pid": cuda_pid, "cpu_pids": sorted(cpu_pids)})  # fmt: skip
    assert report["probes"] == 1
    assert {pid for pid, n in by_pid.items() if n} == {cuda_pid}
    assert by_pid[cuda_pid] >= 100
    assert not any(f"-{pid}-" in name for name in files for pid in cpu_pids)


def test_one_process_on_two_gpus_names_both(tmp_path: Path) -> None:
    if _gpus() < 2:
        pytest.skip("needs two GPUs")
    program = (
        "import torch, json\n"
        "for d in (0, 1):\n"
        "    x = torch.ones(1024, device=f'cuda:{d}'); (x * 2).sum().item()\n"
        "print(json.dumps([f'GPU-{torch.cuda.get_device_properties(d).uuid}' for d in (0, 1)]))\n"
    )
    result, _ = _run(tmp_path, [sys.executable, "-c", program])
    assert result.returncode == 0, result.stderr[-3000:]
    uuids = json.loads(result.stdout.splitlines()[-1])
    batches = list(cuptistream.read(tmp_path / "out").batches())
    named = {(d.device_id, d.uuid) for b in batches for d in b.resource.devices}
    kernel_devices = {e.device_id for b in batches for e in b.events if isinstance(e, Kernel)}
    _record(
        "two_gpus_one_process",
        {"named": sorted(named), "torch_uuids": uuids, "kernel_devices": sorted(kernel_devices)},
    )
    assert kernel_devices == {0, 1}
    assert named == {(0, uuids[0]), (1, uuids[1])}


def test_a_compiled_cuda_program_is_recognised_and_its_exit_status_kept(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if nvcc is None:
        pytest.skip("no nvcc to build a CUDA program")
    source = tmp_path / "app.cu"
    source.write_text(
        "#include <cstdio>\n__global__ void k(int *x) { *x = 1; }\n"
        "int main() { int *x; cudaMalloc(&x, 4); k<<<1, 1>>>(x); cudaDeviceSynchronize();"
        ' std::printf("native ran\\n"); return 5; }\n'
    )
    subprocess.run(
        [nvcc, str(source), "-o", str(tmp_path / "app")], check=True, capture_output=True, timeout=300
    )
    result, report = _run(tmp_path, [str(tmp_path / "app")])
    _record(
        "native_program", {"rc": result.returncode, "stderr": result.stderr, "probes": report.get("probes")}
    )
    assert result.returncode == 5 and "native ran" in result.stdout
    assert "is a compiled CUDA program; only Python processes are probed" in result.stderr
    assert "Traceback" not in result.stderr
