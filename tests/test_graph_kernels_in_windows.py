"""CUDA graph kernels traced in a budget window under a CUPTI that times them wrong there are said
once per stream (``DecodeStream._warn_graph_kernels``), and only then: real W3 buffers (a CUDA graph
of 50 kernels, captured on an H100, ``tests/fixtures/w3_stream.cupti``) decoded by the collector's
decode stream inside trace spans, as the probe announces them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuptistream.channel.messages import OpenStream, TraceSpan
from cuptistream.collector.decoding import FIRST_CUPTI_TIMING_GRAPHS_IN_WINDOWS, DecodeStream
from cuptistream.cupti import capture
from tests.gpu.workloads.collect import Collect

W3 = capture.read(Path(__file__).parent / "fixtures" / "w3_stream.cupti")
KINDS = ["concurrent_kernel", "runtime"]


def _warnings(version: int, span: TraceSpan) -> list[str]:
    sink = Collect()
    info = OpenStream(stream=0, source="activity", cupti_version=version, struct_sizes=dict(W3.struct_sizes),
                      strings=dict(W3.strings))  # fmt: skip
    stream = DecodeStream(info, 0, sink)
    stream.trace_span(span)
    for buffer in W3.buffers:
        stream.decode(memoryview(buffer.data), len(buffer.data), 0)
    return [message for _, message, severity, _ in sink.errors if "CUDA graph kernels" in message]


BUDGET_WINDOW = TraceSpan(stream=0, window=2, start=1, kinds=KINDS)


def test_graph_kernels_in_a_budget_window_under_cupti_13_0_are_said_once() -> None:
    (warning,) = _warnings(130001, BUDGET_WINDOW)  # four buffers of graph kernels, one warning
    assert "CUPTI 130001" in warning and "nvidia-cuda-cupti>=13.5" in warning


@pytest.mark.parametrize(
    ("version", "span"),
    [
        (FIRST_CUPTI_TIMING_GRAPHS_IN_WINDOWS, BUDGET_WINDOW),  # CUPTI 13.5 times them right
        (130001, TraceSpan(stream=0, window=1, start=1, kinds=KINDS)),  # full mode's one span
        (130001, TraceSpan(stream=0, window=2, start=1, kinds=KINDS, on_demand=True)),
        (0, BUDGET_WINDOW),  # a stream that did not say its CUPTI
    ],
    ids=["cupti-13.5", "full-mode", "on-demand", "unknown-version"],
)
def test_no_warning_where_the_graph_kernels_are_timed_right_or_not_known_wrong(
    version: int, span: TraceSpan
) -> None:
    assert _warnings(version, span) == []
