"""One BLAS thread in cuptistream's own processes: the CLI's (the collector) and the decode workers.

numpy's wheels link OpenBLAS, which starts a thread per core when numpy loads, and each of those
threads spins (``sched_yield``) for about 0.1 s before it sleeps. Nothing in cuptistream calls BLAS,
so on a many-core host that is CPU seconds per process for nothing (the collector's "(native
threads)" in ``--report-json``), and each decode worker would pay as much again at its start.
``OPENBLAS_NUM_THREADS=1``, set before numpy
loads, starts none.

The observed program is the user's: ``cuptistream run`` gives it the variable as the user had it
(``as_user_had_it``), never ours.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VARIABLE = "OPENBLAS_NUM_THREADS"
_replaced = False  # whether ``single_threaded`` ran in this process
_users_value: str | None = None  # the variable before it did (None: unset)


def single_threaded() -> None:
    """One BLAS thread for numpy in this process, if numpy has not loaded yet (no effect after)."""
    global _replaced, _users_value
    if not _replaced:
        _replaced, _users_value = True, os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "1"


def as_user_had_it(env: MutableMapping[str, str]) -> None:
    """Undo ``single_threaded`` in ``env``, a copy of this process's environment for a child that
    is the user's program."""
    if not _replaced:
        return
    if _users_value is None:
        env.pop(VARIABLE, None)
    else:
        env[VARIABLE] = _users_value
