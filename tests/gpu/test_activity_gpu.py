"""GPU acceptance for the activity source: every kind decoded against known launches. Runs on a GPU
machine; skipped elsewhere.

Each test runs its workload in a fresh process: CUPTI is process-wide state, and a real program
under ``cuptistream run`` is what users run.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import cuptistream
from cuptistream.events import ApiCall, Error, Kernel, Memcpy, NvtxRange

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
N, B, K, G, GK = 10_000, 64 << 20, 8, 50, 3


def _env() -> dict[str, str]:
    from cuptistream.cupti.driver import nvtx_injection_path

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NVTX_INJECTION64_PATH"] = nvtx_injection_path()
    return env


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def _config(tmp_path: Path, **activity: object) -> Path:
    source = {"type": "activity", **activity}
    cfg = {"sources": [source], "sinks": [{"type": "file", "directory": str(tmp_path / "out")}]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_exact_counts_under_cuptistream_run(tmp_path: Path) -> None:
    cfg = _config(tmp_path, kinds=["concurrent_kernel", "memcpy", "runtime", "driver", "marker"])
    proc = _cli("run", "-c", str(cfg), "--", sys.executable, "-m", "tests.gpu.workloads.exact_counts",
                str(N), str(B), str(K), str(G))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    did = json.loads(proc.stdout.strip().splitlines()[-1])
    events = list(cuptistream.read(tmp_path / "out"))
    kernels = [e for e in events if isinstance(e, Kernel)]
    named = [k for k in kernels if k.name == did["kernel"]]
    assert len(named) == N
    assert all(k.start < k.end for k in named)
    graph_kernels = [k for k in kernels if k.name == did["graph_kernel"]]
    assert len(graph_kernels) == G * GK
    assert all(k.graph_id != 0 and k.graph_node_id != 0 for k in graph_kernels)
    assert all(k.graph_id == 0 for k in named)
    copies = [e for e in events if isinstance(e, Memcpy)]
    assert sum(c.bytes for c in copies) == did["copy_bytes"] == B
    ranges = sorted((e for e in events if isinstance(e, NvtxRange) and e.name.startswith("cs_range_")),
                    key=lambda r: r.depth)  # fmt: skip
    assert [r.name for r in ranges] == [f"cs_range_{d}" for d in range(K)]
    assert [r.depth for r in ranges] == list(range(K))
    for outer, inner in itertools.pairwise(ranges):  # each range encloses the next
        assert outer.start <= inner.start and inner.end <= outer.end
    # Correlation: every kernel's id matches exactly one launch API record.
    launches = collections.Counter(
        e.correlation_id for e in events if isinstance(e, ApiCall) and ("Launch" in e.name)
    )
    assert all(launches[k.correlation_id] == 1 for k in kernels), "a kernel without exactly one launch record"
    print(
        f"kernels={len(kernels)} named={len(named)} graph={len(graph_kernels)} memcpy_bytes="
        f"{sum(c.bytes for c in copies)} nvtx={len(ranges)} api={sum(launches.values())}"
    )


def test_kineto_agreement(tmp_path: Path) -> None:
    steps = "200"
    ours, theirs = tmp_path / "ours.json", tmp_path / "kineto.json"
    for mode, out in (("cuptistream", ours), ("kineto", theirs)):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.gpu.workloads.torch_mlp", mode, steps, str(out)], cwd=ROOT,
            env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = json.loads(ours.read_text()), json.loads(theirs.read_text())
    print("ours", sum(a.values()), "kineto", sum(b.values()), "names", len(a))
    assert a == b


def test_forced_error_keeps_exit_code(tmp_path: Path) -> None:
    # Enabling a kind this GPU cannot trace makes the source fail at start: an Error event, and the
    # program still runs to its own exit code.
    from cuptistream.cupti.kind_support import list_kinds

    unsupported = [k.name for k in list_kinds() if not k.supported]
    assert unsupported, "expected at least one kind this GPU cannot enable"
    cfg = _config(tmp_path, kinds=["concurrent_kernel", unsupported[0]])
    proc = _cli("run", "-c", str(cfg), "--", sys.executable, "-c",
                "import torch, sys; torch.ones(4, device='cuda').sum().item(); sys.exit(7)")  # fmt: skip
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert unsupported[0] in proc.stderr
    errors = [e for e in cuptistream.read(tmp_path / "out") if isinstance(e, Error)]
    assert any(unsupported[0] in e.message for e in errors)
    print("unsupported kind", unsupported[0], "->", errors[0].message)


DETACH_SCRIPT = r"""
import json, sys
import cuptistream
from cuptistream.events import Kernel
from tests.gpu.workloads import exact_counts as w
ctx = w.setup()
out = sys.argv[1]
counts = []
for round_, (traced, untraced) in enumerate([(3000, 500), (2000, 700), (1000, 0)]):
    cfg = {"sources": [{"type": "activity", "kinds": ["concurrent_kernel"]}],
           "sinks": [{"type": "file", "directory": f"{out}/r{round_}"}]}
    with cuptistream.session(cfg, quiet=True):
        w.run(traced, 0, 0, 0, 0, ctx=ctx)
    w.run(untraced, 0, 0, 0, 0, ctx=ctx)  # detached: not traced, must not appear anywhere
    n = sum(1 for e in cuptistream.read(f"{out}/r{round_}") if isinstance(e, Kernel) and e.name == w.KERNEL)
    counts.append(n)
print(json.dumps(counts))
"""


def test_detach_reattach_mid_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DETACH_SCRIPT, str(tmp_path)], cwd=ROOT, env=_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [3000, 2000, 1000]


_READ_PER_THREAD = """
import ctypes, json
import torch
torch.ones(1, device="cuda").add_(1)
torch.cuda.synchronize()  # the probe started at CUDA's start and set its attributes
from cuptistream.cupti import driver, library
value, size = ctypes.c_uint8(255), ctypes.c_size_t(1)
code = library.libcupti().cuptiActivityGetAttribute(9, ctypes.byref(size), ctypes.byref(value))
print(json.dumps({"code": code, "value": value.value, "cupti_version": driver.cupti_version()}))
"""


@pytest.mark.parametrize("per_thread_buffers", [None, False, True], ids=["unset", "false", "true"])
def test_per_thread_buffers_reaches_cupti_as_configured(
    tmp_path: Path, per_thread_buffers: bool | None
) -> None:
    """``CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER`` (9) as the program sees it under ``cuptistream
    run``: the value given, or CUPTI's own default when unset (1 from CUPTI 13 on, says
    ``cupti_activity.h``): an unset config writes nothing, so it must not be reported as ``false``."""
    pytest.importorskip("torch")
    fields = {} if per_thread_buffers is None else {"per_thread_buffers": per_thread_buffers}
    cfg = _config(tmp_path, kinds=["concurrent_kernel"], **fields)
    proc = _cli("run", "-c", str(cfg), "--", sys.executable, "-c", _READ_PER_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0, seen
    if per_thread_buffers is None:
        assert seen["value"] == (1 if seen["cupti_version"] >= 130000 else 0), seen
    else:
        assert seen["value"] == int(per_thread_buffers), seen
