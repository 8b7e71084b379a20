"""Errors a user can cause and fix. The CLI prints their message as one line and exits non-zero."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: bad config, bad arguments, no GPU, unreachable sink.

    The message is one line that names the problem and, where possible, the fix.
    """

    exit_code = 2


class ConfigError(UserError):
    """The config is invalid. The message starts with the key path, e.g. ``sinks[1].batch.max_bytes``."""


class NoGpuError(UserError):
    """No NVIDIA driver or no GPU is present."""

    exit_code = 3


class SinkUnavailableError(UserError):
    """A sink cannot reach its destination at start-up."""

    exit_code = 4
