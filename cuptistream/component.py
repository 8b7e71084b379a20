"""The old name of ``cuptistream.plugin`` (the plug-in contract); it works for one release."""

from typing import Any

from cuptistream.plugin import *  # noqa: F403
from cuptistream.plugin import __all__ as _contract


def __getattr__(name: str) -> Any:
    if name == "ActivityOutlet":  # now beside its implementation, in the channel
        from cuptistream.channel.outlet import ActivityOutlet

        return ActivityOutlet
    import cuptistream.plugin

    return getattr(cuptistream.plugin, name)


__all__ = list(_contract)  # and ActivityOutlet, by name
