"""Shared test setup. GPU tests (``@pytest.mark.gpu``) skip cleanly where no NVIDIA driver can be loaded."""

from __future__ import annotations

import ctypes

import pytest


def _gpu_present() -> bool:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0:
        return False
    return libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


HAVE_GPU = _gpu_present()


# Fixtures that start a real server process: a test that uses one is slow (scripts/test.sh --all runs it).
_SLOW_FIXTURES = {"kafka_broker", "persistent_kafka_broker"}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine; run on the GPU test machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
