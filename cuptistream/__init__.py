"""cuptistream: continuous, config-driven GPU telemetry on NVIDIA CUPTI.

Public API:
- ``session(config)``: a context manager that collects telemetry while it is open;
- ``read(path)``: iterate the events that the file sink wrote;
- ``correlate(...)``: tag GPU work with external correlation ids;
- ``load_config(path)``: validate a config;
- ``events``: the event schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuptistream import events
from cuptistream.config import Config
from cuptistream.config import load as load_config
from cuptistream.errors import ConfigError, NoGpuError, SinkUnavailableError, UserError

__all__ = [
    "Config",
    "ConfigError",
    "NoGpuError",
    "Session",
    "SinkUnavailableError",
    "UserError",
    "correlate",
    "events",
    "load_config",
    "read",
    "session",
]

if TYPE_CHECKING:
    from cuptistream.cupti.external_correlation import correlate
    from cuptistream.recording.reader import read
    from cuptistream.run.session import Session, session


def __getattr__(name: str) -> Any:
    # Imported lazily: the probe in an observed program needs neither trio nor the pipeline, reading
    # files needs no trio, correlating needs CUPTI.
    if name in ("Session", "session"):
        from cuptistream.run import session as in_process

        return getattr(in_process, name)
    if name == "read":
        from cuptistream.recording.reader import read

        return read
    if name == "correlate":
        from cuptistream.cupti.external_correlation import correlate

        return correlate
    raise AttributeError(name)
