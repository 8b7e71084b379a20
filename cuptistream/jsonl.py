"""Moved to ``cuptistream.recording.jsonl``; the old path works for one release (the same module)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("cuptistream.recording.jsonl")
