"""The config: one Struct per section (``model``), YAML loading with its limits (``loading``), one-line
messages (``messages``), the plug-in registry (``registry``) and units (``units``).

``cuptistream.config`` re-exports the model, so ``from cuptistream.config import load, Config`` works.
"""

from cuptistream.config.model import *  # noqa: F403
