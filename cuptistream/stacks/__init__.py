"""The Python stacks of the threads that launch GPU work: sampled in the probe (``sampler``), and
which stack each launch was made from, for the views that join GPU work to them (``index``)."""

from cuptistream.stacks.sampler import (
    BACKWARD,
    NO_PYTHON,
    OWN_THREAD_PREFIX,
    SYNTHETIC_FILE,
    TABLE_FULL,
    THREAD_ID_MASK,
    TRUNCATED,
    Stacked,
    StackSampler,
)

__all__ = [
    "BACKWARD", "NO_PYTHON", "OWN_THREAD_PREFIX", "SYNTHETIC_FILE", "TABLE_FULL", "THREAD_ID_MASK",
    "TRUNCATED", "StackSampler", "Stacked",
]  # fmt: skip
