"""One BLAS thread in cuptistream's own processes (``cuptistream.collector.blas_threads``), and the observed
program's environment as the user had it. Real subprocesses throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuptistream.collector.blas_threads import VARIABLE
from tests.test_coexist import wait_for

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
COUNT_THREADS = "import os, time, numpy; time.sleep(0.2); print(len(os.listdir('/proc/self/task')))"


def _threads_after_numpy(single: bool) -> int:
    setup = (
        "from cuptistream.collector import blas_threads; blas_threads.single_threaded(); " if single else ""
    )
    env = {k: v for k, v in ENV.items() if k != VARIABLE}
    out = subprocess.run([sys.executable, "-c", setup + COUNT_THREADS], env=env, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    return int(out.stdout)


def test_single_threaded_keeps_numpy_from_starting_a_blas_thread_per_core() -> None:
    single, default = _threads_after_numpy(True), _threads_after_numpy(False)
    assert single == 1
    if len(os.sched_getaffinity(0)) > 1:  # OpenBLAS starts one thread per core but one
        assert default > single


@pytest.mark.parametrize("users", [None, "3"])
def test_the_program_under_run_gets_the_variable_as_the_user_had_it(
    tmp_path: Path, users: str | None
) -> None:
    cfg = {"sources": [{"type": "replay", "loops": 1}], "sinks": [{"type": "null"}]}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = {k: v for k, v in ENV.items() if k != VARIABLE}
    if users is not None:
        env[VARIABLE] = users
    program = f"import os; print('seen:', os.environ.get({VARIABLE!r}))"
    result = subprocess.run(
        [sys.executable, "-m", "cuptistream.cli", "run", "-c", str(tmp_path / "cfg.json"), "--quiet", "--",
         sys.executable, "-c", program],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"seen: {users}" in result.stdout


def test_a_decode_worker_starts_with_one_blas_thread() -> None:
    from cuptistream.collector.worker_pool import WorkerPool

    workers = WorkerPool(1)
    try:
        link = workers.assign()
        assert link is not None
        environ = Path(f"/proc/{link.worker.pid}/environ")
        # Read empty while the worker is still being started: wait until the kernel shows it.
        assert wait_for(lambda: environ.read_bytes() != b"", timeout=10.0)
        assert f"{VARIABLE}=1".encode() in environ.read_bytes().split(b"\0")
        link.close()
    finally:
        workers.stop()
