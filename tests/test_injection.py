"""``cuptistream run`` probes every Python process of a command's tree, without a GPU.

Real process trees (spawn, fork, a shell in between, torchrun-style rank variables) under the real
``cuptistream run``. The trigger is the real one: ``cuda.bindings.driver.cuInit``, which the probe
hooks and which fails here after the probe started (no driver can exist on this machine). The
data is real CUPTI output: the replay source hands over the committed H200 captures, so each
probed process contributes exactly the fixtures' events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import cuptistream
from cuptistream.events import Kernel
from cuptistream.run.program import native_cuda_program

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
KERNELS_PER_PROBE = sum(e["decoded_events"].get("Kernel", 0) for e in EXPECTED.values())
CLI = [sys.executable, "-m", "cuptistream.cli"]

# Initializes CUDA as a cuda-python program would; here the driver is missing, so cuInit raises
# after the probe has started.
CUDA_INIT = """
def init_cuda():
    from cuda.bindings import driver
    try:
        driver.cuInit(0)
    except Exception:
        pass
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    return env


def _run(tmp_path: Path, command: list[str], start: str = "cuda") -> tuple[subprocess.CompletedProcess, dict]:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({
        "probe": {"start": start},
        "sources": [{"type": "replay"}],
        "sinks": [{"type": "file", "directory": str(tmp_path / "out")}],
    }))  # fmt: skip
    report = tmp_path / "report.json"
    result = subprocess.run(
        [*CLI, "run", "-c", str(cfg), "--report-json", str(report), "--", *command],
        capture_output=True, text=True, timeout=180, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    return result, json.loads(report.read_text()) if report.exists() else {}


def _kernels_by_pid(out: Path) -> Counter[int]:
    counts: Counter[int] = Counter()
    for batch in cuptistream.read(out).batches():
        counts[batch.resource.pid] += sum(isinstance(e, Kernel) for e in batch.events)
    return Counter({pid: n for pid, n in counts.items() if n})


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(CUDA_INIT + textwrap.dedent(body))
    return path


def test_spawned_workers_only_the_one_that_uses_cuda_is_probed(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "spawn.py",
        """
        import multiprocessing as mp, os

        def cuda_worker(q):
            init_cuda()
            q.put(("cuda", os.getpid()))

        def cpu_worker(q):
            q.put(("cpu", os.getpid()))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            workers = [ctx.Process(target=cpu_worker, args=(q,)) for _ in range(4)]
            workers.append(ctx.Process(target=cuda_worker, args=(q,)))
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            for _ in workers:
                print(*q.get())
    """,
    )
    result, report = _run(tmp_path, ["python", str(script)])
    assert result.returncode == 0, result.stderr
    pids = dict(line.split()[::-1] for line in result.stdout.splitlines())
    cuda_pid = int(next(pid for pid, kind in pids.items() if kind == "cuda"))
    assert report["probes"] == 1
    assert _kernels_by_pid(tmp_path / "out") == {cuda_pid: KERNELS_PER_PROBE}
    assert len(pids) == 5


def test_fork_children_get_their_own_probe_and_a_probed_parent_keeps_its_own(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "fork.py",
        """
        import os, sys

        children = []
        for _ in range(2):  # forked before the parent touches CUDA: each child may use it
            pid = os.fork()
            if pid == 0:
                init_cuda()
                os.write(1, f"child {os.getpid()}\\n".encode())  # one write: the children run at once
                sys.exit(0)  # a normal exit: atexit handlers run in the child
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        init_cuda()  # now the parent starts its probe
        pid = os.fork()
        if pid == 0:  # the child of a probed process must leave the parent's probe alone
            sys.exit(0)
        os.waitpid(pid, 0)
        os.write(1, f"parent {os.getpid()}\\n".encode())
    """,
    )
    result, report = _run(tmp_path, ["python", str(script)])
    assert result.returncode == 0, result.stderr
    pids = [int(line.split()[1]) for line in result.stdout.splitlines()]
    assert report["probes"] == 3
    assert _kernels_by_pid(tmp_path / "out") == {pid: KERNELS_PER_PROBE for pid in pids}
    assert "Traceback" not in result.stderr


def test_a_shell_in_between_and_its_exit_status(tmp_path: Path) -> None:
    child = _script(
        tmp_path,
        "child.py",
        """
        import os
        init_cuda()
        print(os.getpid(), flush=True)
    """,
    )
    shell = tmp_path / "launch.sh"
    shell.write_text(f"#!/bin/sh\n{sys.executable} {child}\n{sys.executable} -u {child}\nexit 7\n")
    shell.chmod(0o755)
    result, report = _run(tmp_path, [str(shell)])
    assert result.returncode == 7, result.stderr
    pids = [int(line) for line in result.stdout.split()]
    assert report["probes"] == 2
    assert _kernels_by_pid(tmp_path / "out") == {pid: KERNELS_PER_PROBE for pid in pids}


def test_ranks_get_one_file_set_each_with_their_rank(tmp_path: Path) -> None:
    # What torchrun does: one process per rank, RANK/LOCAL_RANK/WORLD_SIZE in each environment.
    launcher = _script(
        tmp_path,
        "launcher.py",
        """
        import os, subprocess, sys
        procs = [
            subprocess.Popen([sys.executable, sys.argv[1]],
                             env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"})
            for r in range(2)
        ]
        sys.exit(max(p.wait() for p in procs))
    """,
    )
    worker = _script(tmp_path, "worker.py", "init_cuda()\n")
    result, report = _run(tmp_path, ["python", str(launcher), str(worker)])
    assert result.returncode == 0, result.stderr
    assert report["probes"] == 2
    out = tmp_path / "out"
    by_rank: dict[int, set[int]] = {}
    for path in sorted(out.iterdir()):
        if "-rank" not in path.name:
            continue
        rank = int(path.name.split("-rank")[1].split("-")[0])
        for batch in cuptistream.read(path).batches():
            assert (batch.resource.rank, batch.resource.local_rank, batch.resource.world_size) == (
                rank,
                rank,
                2,
            )
            by_rank.setdefault(rank, set()).add(batch.resource.pid)
    assert sorted(by_rank) == [0, 1] and all(len(pids) == 1 for pids in by_rank.values())
    assert sum(_kernels_by_pid(out).values()) == 2 * KERNELS_PER_PROBE


def test_processes_that_never_use_cuda_are_not_probed_and_say_nothing(tmp_path: Path) -> None:
    result, report = _run(tmp_path, ["python", "-c", "import json, subprocess; print('no gpu here')"])
    assert result.returncode == 0
    assert report["probes"] == 0
    assert "no Python process of" in result.stderr and "probe: {start: process}" in result.stderr
    result, report = _run(tmp_path, ["python", "-c", "print('probed anyway')"], start="process")
    assert report["probes"] == 1, result.stderr


def test_run_without_double_dash_and_interpreter_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"sources: [{{type: replay}}]\nsinks: [{{type: file, directory: {tmp_path / 'out'}}}]\n")
    result = subprocess.run(
        [*CLI, "run", "-c", str(cfg), "--quiet", "python", "-u", "-X", "dev", "-c",
         "import sys; print(sys.flags.dev_mode, sys.stdout.write_through)"],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    assert sum(_kernels_by_pid(tmp_path / "out").values()) == KERNELS_PER_PROBE


def test_native_cuda_programs_are_recognised(tmp_path: Path) -> None:
    # A compiled CUDA program cannot be built here (no nvcc); an ELF file naming the CUDA runtime
    # stands in for one. The GPU test compiles a real one (tests/gpu/test_multiprocess_gpu.py).
    fake = tmp_path / "app"
    fake.write_bytes(b"\x7fELF" + b"\0" * 60 + b"libcudart.so.13\0")
    assert native_cuda_program(str(fake))
    assert not native_cuda_program(sys.executable)  # the interpreter itself
    assert not native_cuda_program("/bin/sh")
    script = tmp_path / "script.py"
    script.write_text("libcudart.so")
    assert not native_cuda_program(str(script))


def test_the_boot_hook_imports_nothing_of_cuptistream_until_cuda(tmp_path: Path) -> None:
    # A process that never uses CUDA carries the import hook only: no cuptistream module, no thread.
    probe = "import sys, threading; print(sorted(m for m in sys.modules if m.startswith('cuptistream')), threading.active_count())"
    result, report = _run(tmp_path, ["python", "-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] 1"
    assert report["probes"] == 0


def test_the_command_line_reaches_the_envelope_only_when_enabled(tmp_path: Path) -> None:
    marker = "--token=planted-secret"
    for enabled in (False, True):
        out = tmp_path / f"out-{enabled}"
        cfg = tmp_path / f"cfg-{enabled}.json"
        cfg.write_text(json.dumps({
            "session": {"command_line": enabled},
            "sources": [{"type": "replay"}],
            "sinks": [{"type": "file", "directory": str(out)}],
        }))  # fmt: skip
        result = subprocess.run([*CLI, "run", "-c", str(cfg), "--quiet", "--", "python", "-c", "pass", marker],
                                capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = {arg for b in cuptistream.read(out).batches() for arg in b.resource.command_line}
        assert (marker in lines) is enabled


def test_threads_that_reach_cuda_while_the_probe_starts_wait_for_it(tmp_path: Path) -> None:
    # Eight threads initialize CUDA at once. Only one starts the probe; the others must not get past
    # cuInit before it has started (their CUDA work would precede the probe, untraced, and the
    # activity source would find a context it must assume holds CUDA graphs).
    script = _script(
        tmp_path,
        "threads.py",
        """
        import sys, threading
        barrier, early = threading.Barrier(8), []

        def worker():
            barrier.wait()
            init_cuda()
            bootstrap = sys.modules.get("cuptistream.probe.bootstrap")
            early.append(bootstrap is None or bootstrap._probe is None)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(sum(early), len(early))
    """,
    )
    result, report = _run(tmp_path, ["python", str(script)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "8"], result.stderr
    assert report["probes"] == 1
