"""Decoding real CUPTI activity buffers captured on an H100 (sources/captures/*.cupti).

The expected values in ``tests/fixtures/expected.json`` came from an independent route on the GPU:
CUPTI's own ``cuptiActivityGetNextRecord`` walk and cupti-python's record classes over the same raw
bytes. Here our bulk decoder must reproduce them exactly, with no GPU.
"""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from cuptistream.collector.buffer_decoder import Decoder
from cuptistream.cupti import capture, kinds
from cuptistream.cupti.names import TableNames
from cuptistream.cupti.records import LayoutError, RecordLayouts, choose_dtype, walk
from cuptistream.events import ApiCall, ExternalCorrelation, Kernel, Memcpy, NvtxRange
from cuptistream.sources.replay import DEFAULT_PATH as CAPTURES  # shipped real-GPU captures

FIXTURES = Path(__file__).parent / "fixtures"

EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)


def _decode(name: str, demangle: bool = False) -> tuple[list, capture.Capture, Decoder]:
    cap = capture.read(CAPTURES / f"{name}.cupti")
    decoder = Decoder(TableNames(cap.strings), RecordLayouts(dict(cap.struct_sizes)), demangle)
    events = [e for buf in cap.buffers for e in decoder.decode(buf.data, len(buf.data))]
    return events, cap, decoder


def _label(kind: int) -> str:
    spec = kinds.BY_VALUE.get(kind)
    return spec.name if spec else str(kind)


@pytest.mark.parametrize("name", NAMES)
def test_record_counts_match_cuptis_own_walk(name: str) -> None:
    cap = capture.read(CAPTURES / f"{name}.cupti")
    layouts = RecordLayouts(dict(cap.struct_sizes))
    counts: collections.Counter[str] = collections.Counter()
    for buf in cap.buffers:
        for kind, offsets in walk(memoryview(buf.data), len(buf.data), layouts, None).items():
            counts[_label(kind)] += len(offsets)
    assert dict(counts) == EXPECTED[name]["records_by_kind"]


@pytest.mark.parametrize("name", NAMES)
def test_event_counts_match_the_gpu_run(name: str) -> None:
    events, _, decoder = _decode(name)
    by_type = collections.Counter(type(e).__name__ for e in events)
    assert dict(by_type) == EXPECTED[name]["decoded_events"]
    assert decoder.unknown_kinds == {}
    assert decoder.names.missing == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", NAMES)
def test_kernel_names_and_bytes_match_the_oracle(name: str) -> None:
    events, _, _ = _decode(name)
    names = collections.Counter(e.name for e in events if isinstance(e, Kernel))
    assert dict(names) == EXPECTED[name]["kernel_names"]
    assert sum(e.bytes for e in events if isinstance(e, Memcpy)) == EXPECTED[name]["memcpy_bytes"]


@pytest.mark.parametrize("name", NAMES)
def test_first_record_fields_match_the_oracle(name: str) -> None:
    events, _, _ = _decode(name)
    first_of: dict[str, object] = {}
    for event in events:
        first_of.setdefault(type(event).__name__, event)
    for kind, fields in EXPECTED[name]["first"].items():
        spec = kinds.KINDS[kind]
        if spec.event == "kernel":
            k = next(e for e in events if isinstance(e, Kernel))
            assert (k.start, k.end, k.name, k.correlation_id) == (
                fields["start"],
                fields["end"],
                fields["name"],
                fields["correlation_id"],
            )
            assert (k.grid[0], k.block[0], k.registers_per_thread) == (
                fields["grid_x"],
                fields["block_x"],
                fields["registers_per_thread"],
            )
            assert (k.graph_id, k.graph_node_id, k.stream_id) == (
                fields["graph_id"],
                fields["graph_node_id"],
                fields["stream_id"],
            )
        elif spec.event == "memcpy":
            m = next(e for e in events if isinstance(e, Memcpy))
            assert (m.start, m.end, m.bytes, m.correlation_id) == (
                fields["start"],
                fields["end"],
                fields["bytes"],
                fields["correlation_id"],
            )
        elif spec.event == "api":
            domain = "runtime" if kind == "runtime" else "driver"
            a = next(e for e in events if isinstance(e, ApiCall) and e.domain == domain)
            assert (a.cbid, a.start, a.end, a.correlation_id) == (
                fields["cbid"],
                fields["start"],
                fields["end"],
                fields["correlation_id"],
            )


def test_exact_counts_fixture_tells_the_workload_story() -> None:
    events, _, _ = _decode("exact_counts")
    did = EXPECTED["exact_counts"]["workload"]
    kernels = [e for e in events if isinstance(e, Kernel)]
    assert sum(k.name == did["kernel"] for k in kernels) == did["launches"]
    graph = [k for k in kernels if k.name == did["graph_kernel"]]
    assert len(graph) == did["graph_replays"] * did["graph_kernels"]
    assert all(k.graph_id and k.graph_node_id for k in graph)
    assert all(k.start < k.end for k in kernels)
    assert sum(e.bytes for e in events if isinstance(e, Memcpy)) == did["copy_bytes"]
    ranges = sorted((e for e in events if isinstance(e, NvtxRange)), key=lambda r: r.depth)
    assert [r.depth for r in ranges] == list(range(did["nvtx_depth"]))
    assert all(o.start <= i.start and i.end <= o.end for o, i in itertools.pairwise(ranges))
    launches = collections.Counter(
        e.correlation_id for e in events if isinstance(e, ApiCall) and "Launch" in e.name
    )
    assert all(launches[k.correlation_id] == 1 for k in kernels)


def test_torch_fixture_has_demangled_names_and_external_correlation() -> None:
    events, _, _ = _decode("torch_train", demangle=True)
    kernels = [e for e in events if isinstance(e, Kernel)]
    assert kernels and any(k.demangled_name and "(" in k.demangled_name for k in kernels)
    tags = [e for e in events if isinstance(e, ExternalCorrelation)]
    assert tags and {t.external_id for t in tags} == {EXPECTED["torch_train"]["workload"]["external_id"]}
    assert {t.external_kind for t in tags} == {"custom0"}
    tagged = {t.correlation_id for t in tags}
    assert any(k.correlation_id in tagged for k in kernels)  # kernels of the tagged step link back


# --- the decoder on crafted buffers: layouts and failure modes --------------------------------------


def test_dtype_is_chosen_by_the_size_cupti_reports() -> None:
    for size, record in ((208, "kernel9"), (224, "kernel11"), (248, "kernel13")):
        chosen = choose_dtype(kinds.KINDS["concurrent_kernel"].kind, size)
        assert chosen is not None and chosen[0] == record
    assert choose_dtype(kinds.KINDS["concurrent_kernel"].kind, 123) is None


def test_unknown_kind_size_is_learned_or_reported() -> None:
    from cupti import cupti

    api = np.zeros(3, cupti.activity_api_dtype)
    api["kind"] = 5
    data = memoryview(api.tobytes())
    with pytest.raises(LayoutError, match="no record size known for activity kind 5"):
        walk(data, len(data), RecordLayouts(), None)
    layouts = RecordLayouts()
    assert walk(data, len(data), layouts, lambda kind, offset: 40) == {5: [0, 40, 80]}
    assert layouts.sizes == {5: 40}
    with pytest.raises(LayoutError, match="overrun"):
        walk(data, len(data), RecordLayouts({5: 80}), None)


def test_marker_ranges_pair_across_buffers_and_ignore_orphan_ends() -> None:
    from cupti import cupti

    m = np.zeros(3, cupti.activity_marker2_dtype)
    m["kind"] = 12
    m["flags_"] = [4, 2, 4]  # an END whose START came before we attached, then a START ... END
    m["id"] = [9, 1, 1]
    m["name"] = [0, 0x10, 0]
    m["timestamp"] = [5, 10, 20]
    decoder = Decoder(TableNames({0x10: "step"}), RecordLayouts({12: m.dtype.itemsize}))
    first = m[:2].tobytes()
    assert decoder.decode(first, len(first)) == []
    second = m[2:].tobytes()
    (event,) = decoder.decode(second, len(second))
    assert (event.name, event.start, event.end, event.depth) == ("step", 10, 20, 0)


def _walk_record_by_record(data: memoryview, valid: int, sizes: dict[int, int]) -> dict[int, list[int]]:
    """The walk as its docstring says it, one record at a time: the reference for the run matcher."""
    ints = data[: valid - valid % 4].cast("i")
    found: dict[int, list[int]] = {}
    offset = 0
    while offset < valid:
        kind = ints[offset >> 2]
        found.setdefault(kind, []).append(offset)
        offset += sizes[kind]
    return found


def test_the_run_matcher_finds_every_record_the_record_by_record_walk_does() -> None:
    """Real buffers (the shipped captures and W3's 4 MiB ones: ~25 kernels a run between API
    records), then records whose bytes hold other kinds' numbers where a record would begin if the
    matcher stepped wrong."""
    from cupti import cupti

    from cuptistream.sources.replay import DEFAULT_PATH

    paths = [*sorted(DEFAULT_PATH.glob("*.cupti"))]
    paths.append(Path(__file__).resolve().parent / "fixtures" / "w3_stream.cupti")
    checked = 0
    for path in paths:
        cap = capture.read(path)
        for buf in cap.buffers:
            data = memoryview(buf.data)
            got = walk(data, len(data), RecordLayouts(dict(cap.struct_sizes)), None)
            expected = _walk_record_by_record(data, len(data), dict(cap.struct_sizes))
            assert list(got) == list(expected)  # kinds in the order they first appear
            assert got == expected
            checked += sum(len(v) for v in expected.values())
    assert checked > 60_000

    api = np.zeros(7, cupti.activity_api_dtype)
    api["kind"] = 5
    api["correlation_id"] = 10  # 10: the kernel kind's number, 4-byte aligned inside an API record
    kernels = np.zeros(3, cupti.activity_kernel9_dtype)
    kernels["kind"] = 10
    kernels["start"] = 5
    data = memoryview(
        b"".join([api[:2].tobytes(), kernels.tobytes(), api[2:].tobytes(), kernels[:1].tobytes()])
    )
    sizes = {5: api.dtype.itemsize, 10: kernels.dtype.itemsize}
    got = walk(data, len(data), RecordLayouts(dict(sizes)), None)
    assert got == _walk_record_by_record(data, len(data), sizes)
    assert [len(v) for v in got.values()] == [7, 4]
