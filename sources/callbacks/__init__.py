"""The ``callbacks`` source: CUPTI callback domains as events.

Domains (``domains:`` in YAML):

- ``resource``: context, stream and module lifecycle (``ResourceChange``; modules carry CUPTI's cubin
  CRC and size, the same CRC that PC sampling reports) and graph / graph-node create, clone and
  destroy (``GraphNode``);
- ``synchronize``: stream and context synchronizations (``Synchronization``, a point in time:
  ``start == end`` is when CUPTI reported that the synchronization finished);
- ``nvtx``: ranges (push/pop with per-thread nesting depth, start/end), markers, domains, categories,
  payloads and colours (``NvtxRange``, ``NvtxMarker``);
- ``runtime`` / ``driver``: the API functions named in ``runtime_api`` / ``driver_api`` only, with
  entry and exit times (``ApiCall``).

How it stays cheap: each callback runs inside the application's CUDA or NVTX call. It reads the
few fields it needs straight from CUPTI's structs (ctypes, following ``cupti_callbacks.h``), appends
one plain tuple to a deque and returns. A worker thread turns tuples into events and hands them to
the emitter in chunks. When the deque holds ``max_buffered`` records, new ones are dropped and
counted as a loss; a callback never waits.

NVTX needs CUPTI injected into NVTX before the program's first NVTX call: ``NVTX_INJECTION64_PATH``
must name libcupti. ``start()`` sets it (unless already set) when ``nvtx`` is enabled, which is in
time for a session opened before the first NVTX call; ``cuptistream run`` sets it for the child.

Failure modes: ``start()`` raises ``SubscriberBusy`` when another tool holds CUPTI's callback
subscriber (the session disables this source and emits an Error event naming that tool),
``CuptiUnavailable`` without a driver. A ``runtime_api``/``driver_api`` pattern that matches no
function is a config error when the config is loaded. A failure in the worker is reported as an
Error event and the worker keeps going.
"""

from .config import DEFAULT_DRIVER_API, DEFAULT_RUNTIME_API, CallbackDomainName, CallbacksConfig
from .source import CallbackSource

__all__ = [
    "DEFAULT_DRIVER_API",
    "DEFAULT_RUNTIME_API",
    "CallbackDomainName",
    "CallbackSource",
    "CallbacksConfig",
]
