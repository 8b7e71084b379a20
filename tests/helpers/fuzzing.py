"""Hypothesis settings shared by the fuzz tests (tests/test_fuzz_*.py).

CI runs a small sample (200 examples per test, seconds). A nightly-size run sets the count:

    CUPTISTREAM_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest -q tests/test_fuzz_recordings.py tests/test_fuzz_config.py

Failures print the failing example and a ``@reproduce_failure`` line; no example database is kept
(``database=None``), so runs never write into the repository.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("CUPTISTREAM_FUZZ_EXAMPLES", "200"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=10),  # an example this slow is a hang to find, not noise
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
