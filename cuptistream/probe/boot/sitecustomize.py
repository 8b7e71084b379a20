"""Run by Python at start-up in every process of a program that ``cuptistream run`` started: this
folder is on ``PYTHONPATH`` and the environment names the collector, so subprocesses, spawned and
forked workers and the Pythons a shell script starts all come here.

It only arms a trigger (``_cuptistream_trigger``), with the standard library: the probe starts when
the process first initializes CUDA, or at once with ``CUPTISTREAM_PROBE_START=process``. A process
that never touches CUDA pays for one import hook and imports nothing of cuptistream. Then the
``sitecustomize`` this one shadows runs.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

_COLLECTOR = "CUPTISTREAM_COLLECTOR"
_START = "CUPTISTREAM_PROBE_START"


def _start() -> None:
    try:
        from cuptistream.probe.bootstrap import start_from_environment
    except Exception as error:  # not installed for this interpreter, or broken: run on without
        print(f"cuptistream: telemetry is off for pid {os.getpid()} ({sys.executable}): "
              f"cannot import cuptistream: {error}", file=sys.stderr, flush=True)  # fmt: skip
        return
    start_from_environment()


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get(_COLLECTOR):
    from _cuptistream_trigger import arm  # beside this file, on PYTHONPATH

    arm(_start, os.environ.get(_START, "cuda"))
_run_shadowed()
