"""Every exception a user or a plug-in can meet, in one tree. Each says what it means in one line.

- ``UserError``: a problem the user can fix; the CLI prints it as one line and exits non-zero.
  - ``ConfigError`` (2), ``NoGpuError`` (3: ``LibraryNotFoundError``, ``CuptiUnavailable``),
    ``SinkUnavailableError`` (4: ``PermanentSinkError``), ``ChannelError``, ``DamageError``,
    ``SubscriberBusy``.
- For sinks: ``RetryableError`` (this attempt failed, a later one may not), ``RetriesExhausted``,
  ``DeliveryError`` (a batch is lost; the pipeline does not retry it).
- From the CUPTI layer and readers: ``CuptiError``, ``LayoutError``, ``JsonlError``.

The modules that raise them re-export them too (``cuptistream.delivery.retry.RetryableError`` and
the like).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


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


# --- failures of the data path (moved here from their modules, which re-export them) ---


class ChannelError(UserError):
    """The probe↔collector channel cannot be set up or used."""


class RetryableError(Exception):
    """An attempt failed for a reason that may pass (HTTP 503, connection refused, disk full).

    ``reason`` is short ("HTTP 503", "ConnectError"); ``retry_after`` is the wait the server asked for
    (seconds), which replaces the backoff for the next attempt.
    """

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class RetriesExhausted(Exception):
    """No attempt succeeded before the deadline (or retrying is off). ``reason`` is the last failure."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class DeliveryError(Exception):
    """A batch could not be delivered and will not be retried by the pipeline. The message starts
    with ``Sink.where()``.

    ``lost``: which of the batch's events were lost, by reason (e.g. ``{"delivery_failed": 120}``);
    the rest count as delivered. None (the default): all of them, as ``delivery_failed``.
    """

    def __init__(self, message: str, lost: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.lost = lost


class DamageError(UserError):
    """Raised instead of ``DamageWarning`` when reading with ``strict=True``."""

    def __init__(self, damage: Any) -> None:  # a cuptistream.recording.reader.Damage
        super().__init__(damage.describe())
        self.damage = damage
        self.tail = damage


class JsonlError(ValueError):
    """A line that is not part of cuptistream's JSON Lines layout."""


class CuptiError(RuntimeError):
    """A CUPTI call failed. ``code`` is the ``CUptiResult``; ``call`` the function's name; ``text``
    what went wrong (CUPTI's name for ``code`` unless the caller knows better)."""

    # CUPTI's name for a result code; ``cuptistream.cupti.library`` installs the real one (it imports
    # this module, so this module cannot import it).
    result_name: Callable[[int], str] = staticmethod(lambda code: f"CUPTI result {code}")

    def __init__(self, call: str, code: int, text: str | None = None) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed: {text or CuptiError.result_name(code)} (CUptiResult {code})")


class LibraryNotFoundError(NoGpuError):
    """libcupti could not be found or loaded."""


class SubscriberBusy(UserError):
    """Another tool holds CUPTI's only callback subscriber."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        who = f"{holder!r}" if holder else "another CUPTI tool (it did not give its name)"
        super().__init__(
            f"CUPTI callbacks are already taken by {who}; only one subscriber per process is allowed, "
            "so stop that tool (Nsight, torch.profiler, another cuptistream session) or remove the "
            "callback-based sources from the config"
        )


class CuptiUnavailable(NoGpuError):
    """CUPTI cannot run here (no driver, no GPU, or an unusable libcupti)."""


class LayoutError(Exception):
    """A buffer's records could not be walked (unknown kind size, or a walk past the end)."""
