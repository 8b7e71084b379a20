"""Run by Python at start-up in programs that ``cuptistream run`` starts (this folder is put on
``PYTHONPATH``): start the probe before the program's first line, then run the
``sitecustomize`` this one shadows, if any."""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("CUPTISTREAM_COLLECTOR"):
    from cuptistream.probe.bootstrap import start_from_environment

    start_from_environment()
_run_shadowed()
