"""Errors a user can cause and fix. The CLI prints their message as one line and exits non-zero."""

from __future__ import annotations

import re


class UserError(Exception):
    """A problem the user can fix: bad config, bad arguments, no GPU, unreachable sink.

    The message is one line that names the problem and, where possible, the fix. Line breaks that
    reach it from user input (a YAML key, a file name) are escaped, so it stays one line.
    """

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(_one_line(arg) if isinstance(arg, str) else arg for arg in args))


# Everything str.splitlines() breaks at: a terminal or a log parser may, too.
_LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def _one_line(text: str) -> str:
    return _LINE_BREAKS.sub(lambda match: repr(match.group())[1:-1], text)


class ConfigError(UserError):
    """The config is invalid. The message starts with the key path, e.g. ``sinks[1].batch.max_bytes``."""


class NoGpuError(UserError):
    """No NVIDIA driver or no GPU is present."""

    exit_code = 3


class SinkUnavailableError(UserError):
    """A sink cannot reach its destination at start-up."""

    exit_code = 4


class PermanentSinkError(SinkUnavailableError):
    """A sink's destination refused it for a reason no retry fixes: a login refused, a certificate
    that does not verify, an HTTP 401 or 403. The sink stops (the program and the other sinks go
    on); what it would have sent is counted lost under ``reason`` (e.g. ``auth_failed``). The
    message is one line naming the sink, the problem and the fix."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
