"""PC samples as OTLP profiles: the real H200 PC-sampling capture (tests/fixtures/sampling/, decoded
from CUPTI's bytes) through the OTLP sink to the real receivers, decoded with opentelemetry-proto's
profiles classes and counted back: exactly the same samples per (cubin, function, PC, stall reason)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cuptistream.events import PcSample, PcSampleBatch, StackStats, StackTable
from tests.otlp_batches import OFFSET, make_batch
from tests.otlp_grpc_receiver import OtlpGrpcReceiver
from tests.otlp_receiver import OtlpReceiver
from tests.test_otlp import attrs, deliver, sink_for

CAPTURE = json.loads((Path(__file__).parent / "fixtures" / "sampling" / "pc_sampling_h200.json").read_text())
PERIOD = 14  # tests/fixtures/sampling/README.md: sampling period 2^14 cycles

Key = tuple[int, str, int, str]  # cubin CRC, function, PC offset, stall reason


def captured() -> list[PcSample]:
    return msgspec.convert(CAPTURE["decoded"]["samples"], list[PcSample])


def drain(samples: list[PcSample], timestamp: int) -> PcSampleBatch:
    return PcSampleBatch(
        timestamp=timestamp, device_id=0, context_id=1, range_id=CAPTURE["decoded"]["range_id"], samples=samples,
        total_samples=sum(sum(s.stalls.values()) for s in samples), sampling_period=PERIOD,
    )  # fmt: skip


def expected() -> Counter[Key]:
    return expected_of(captured())


def counted(requests: list[Any]) -> tuple[Counter[Key], list[Any]]:
    """Samples per key read back through each request's own dictionary, and every profile."""
    counts: Counter[Key] = Counter()
    profiles = []
    for request in requests:
        d = request.dictionary
        strings = d.string_table
        assert strings[0] == "" and d.location_table[0] == type(d.location_table[0])()  # zero values first
        for rp in request.resource_profiles:
            for sp in rp.scope_profiles:
                for profile in sp.profiles:
                    profiles.append((profile, d))
                    for sample in profile.samples:
                        (location_index,) = d.stack_table[sample.stack_index].location_indices
                        location = d.location_table[location_index]
                        mapping = d.mapping_table[location.mapping_index]
                        (crc_attr,) = [d.attribute_table[i] for i in mapping.attribute_indices]
                        function = d.function_table[location.lines[0].function_index]
                        labels = {
                            strings[a.key_strindex]: a.value
                            for a in map(d.attribute_table.__getitem__, sample.attribute_indices)
                        }
                        assert set(labels) == {"cuda.pc_sampling.stall_reason", "cuda.pc_sampling.issued"}
                        assert strings[crc_attr.key_strindex] == "cuda.cubin.crc"
                        (value,) = sample.values
                        reason = labels["cuda.pc_sampling.stall_reason"].string_value
                        pc = (crc_attr.value.int_value, strings[function.name_strindex], location.address)
                        counts[(*pc, reason)] += value  # CUPTI counts every sample under its reason,
                        if not labels["cuda.pc_sampling.issued"].bool_value:  # and again if not issued
                            counts[(*pc, reason + "_not_issued")] += value
    return counts, profiles


@pytest.fixture
def receiver() -> Any:
    with OtlpReceiver() as r:
        yield r


def test_captured_pc_samples_round_trip_exactly(receiver: OtlpReceiver) -> None:
    samples = captured()
    first, second = (
        drain(samples[:60], 5_000_000),
        drain(samples[60:], 105_000_000),
    )  # two drains, 100 ms apart
    sink = sink_for(receiver.endpoint, signals=["profiles"])
    assert deliver(sink, make_batch([first]), make_batch([second], seq=1)) == []
    requests = receiver.messages("/v1development/profiles")
    counts, profiles = counted(requests)
    assert counts == expected()
    values = sum(v for p, _ in profiles for s in p.samples for v in s.values)
    assert values == CAPTURE["decoded"]["total_samples"] == 148409  # a viewer's sum is the samples taken
    per_reason: Counter[str] = Counter()
    per_pc: Counter[tuple[int, str, int]] = Counter()
    for (crc, function, pc, reason), n in counts.items():
        per_reason[reason] += n
        per_pc[(crc, function, pc)] += n
    assert len(per_pc) == len(samples) == 127
    want_reason: Counter[str] = Counter()
    for s in samples:
        want_reason.update(s.stalls)
    assert per_reason == +want_reason

    assert len(profiles) == 2 and sink.stats()["profiles_sent"] == 2
    (p1, d1), (p2, _) = profiles
    assert d1.string_table[p1.sample_type.type_strindex] == "samples"
    assert d1.string_table[p1.period_type.type_strindex] == "cycles" and p1.period == 2**PERIOD
    assert (p1.time_unix_nano, p1.duration_nano) == (OFFSET + 5_000_000, 0)  # the context's first drain
    assert (p2.time_unix_nano, p2.duration_nano) == (OFFSET + 5_000_000, 100_000_000)  # since the first
    assert len(p1.profile_id) == 16 and p1.profile_id != p2.profile_id
    functions = {d1.string_table[f.name_strindex] for f in d1.function_table[1:]}
    assert functions <= {"dep_chain", "strided", "other_module_kernel"} and functions
    res = attrs(requests[0].resource_profiles[0].resource)
    assert res["host.name"] == "gpu-host-1"


def test_a_split_request_keeps_every_sample(receiver: OtlpReceiver) -> None:
    samples = captured()
    drains = [drain(samples[i : i + 10], 1_000 * i) for i in range(0, len(samples), 10)]
    sink = sink_for(receiver.endpoint, signals=["profiles"], max_request_bytes="8KiB")
    assert deliver(sink, make_batch(drains)) == []
    assert sink.stats()["profiles_dropped"] == 0 and sink.stats()["profiles_sent"] == len(drains)
    requests = receiver.messages("/v1development/profiles")
    assert len(requests) >= 2  # each request with its own dictionary
    assert counted(requests)[0] == expected()


def test_profiles_over_grpc() -> None:
    with OtlpGrpcReceiver() as receiver:
        sink = sink_for(receiver.endpoint, signals=["profiles"], protocol="grpc")
        assert deliver(sink, make_batch([drain(captured(), 7)])) == []
        assert counted(receiver.messages("profiles"))[0] == expected()


def test_a_backend_without_profiles_ends_only_that_signal(receiver: OtlpReceiver) -> None:
    from tests.otlp_batches import step_events
    from tests.otlp_receiver import Answer

    receiver.answer("/v1development/profiles", Answer(404))
    sink = sink_for(receiver.endpoint, signals=["traces", "profiles"])
    errors = deliver(
        sink, make_batch([*step_events(), drain(captured(), 7)]), make_batch([drain(captured(), 9)], seq=1)
    )
    # Each batch whose profiles are lost says so; the first names the refusal.
    assert len(errors) == 2 and "refused profiles with HTTP 404" in str(errors[0])
    assert receiver.count("/v1development/profiles") == 1 and sink.stats()["profiles_dropped"] == 2
    assert sink.stats()["spans_sent"] == 16


# --- GPU time by launching stack (StackStats) -------------------------------------------------------


def captured_tables() -> list[StackTable]:
    """The StackTable events of the GPU capture with stacks on (tests/fixtures/stacks)."""
    from cuptistream.analysis.sources import open_recordings

    recording = open_recordings([str(Path(__file__).parent / "fixtures" / "stacks")])
    return [e for part in recording.parts() for e in part.events if isinstance(e, StackTable)]


def stack_frames(request: Any, profile: Any) -> dict[tuple[tuple[str, str, int], ...], int]:
    """Each sample's frames (file, function, line), innermost first, to its value."""
    d = request.dictionary
    strings = d.string_table
    out = {}
    for sample in profile.samples:
        frames = []
        for location_index in d.stack_table[sample.stack_index].location_indices:
            (line,) = d.location_table[location_index].lines
            function = d.function_table[line.function_index]
            frames.append((strings[function.filename_strindex], strings[function.name_strindex], line.line))
        (out[tuple(frames)],) = sample.values
    return out


def test_gpu_time_by_stack_becomes_profiles_of_the_captured_frames(receiver: OtlpReceiver) -> None:
    tables = captured_tables()
    frames = {f: (file, function, line) for t in tables
              for f, file, function, line in zip(t.frame_ids, t.files, t.functions, t.lines, strict=True)}  # fmt: skip
    stacks = {s: ids for t in tables for s, ids in zip(t.stack_ids, t.stacks, strict=True)}
    chosen = sorted(stacks)[:5]
    assert len(chosen) == 5
    rows = [*chosen, -1, -3]
    stats = StackStats(
        interval_start=10_000_000_000, interval_end=20_000_000_000, device_id=0,
        process_id=tables[0].process_id, traced_ns=2_500_000_000, stack_ids=rows,
        gpu_ns=[1000 * (i + 1) for i in range(len(rows))], launches=[i + 1 for i in range(len(rows))],
        estimated=True, estimated_gpu_ns=[4000 * (i + 1) for i in range(len(rows))],
        estimated_launches=[4 * (i + 1) for i in range(len(rows))],
    )  # fmt: skip
    pc = drain(captured()[:10], 5_000_000)
    sink = sink_for(receiver.endpoint, signals=["profiles"])
    # The tables come in an earlier batch than the statistics: the sink keeps them for the process.
    assert deliver(sink, make_batch(tables), make_batch([pc, stats], seq=1)) == []
    assert sink.stats()["profiles_sent"] == 2  # one item per event: the PC drain, the statistics
    (request,) = receiver.messages("/v1development/profiles")
    profiles = [p for rp in request.resource_profiles for sp in rp.scope_profiles for p in sp.profiles]
    strings = request.dictionary.string_table
    by_type = {strings[p.sample_type.type_strindex]: p for p in profiles}
    assert set(by_type) == {"samples", "gpu_time", "launches", "gpu_time_estimated", "launches_estimated"}
    assert strings[by_type["gpu_time"].sample_type.unit_strindex] == "nanoseconds"
    want = {tuple(frames[f] for f in reversed(stacks[s])): i for i, s in enumerate(chosen)}  # innermost first
    want[(("<cuptistream>", "[no stack recorded]", 0),)] = 5
    want[(("<cuptistream>", "other", 0),)] = 6
    for kind, scale in (
        ("gpu_time", 1000),
        ("gpu_time_estimated", 4000),
        ("launches", 1),
        ("launches_estimated", 4),
    ):
        assert stack_frames(request, by_type[kind]) == {k: scale * (i + 1) for k, i in want.items()}, kind
        p = by_type[kind]
        assert (p.time_unix_nano, p.duration_nano) == (OFFSET + 10_000_000_000, 10_000_000_000)
    assert counted([_only(request, by_type["samples"])])[0] == expected_of(
        captured()[:10]
    )  # PC stacks intact


def _only(request: Any, profile: Any) -> Any:
    """``request`` with ``profile`` alone (its dictionary kept)."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest,
    )

    copy = ExportProfilesServiceRequest()
    copy.CopyFrom(request)
    for rp in copy.resource_profiles:
        for sp in rp.scope_profiles:
            kept = [p for p in sp.profiles if p == profile]
            del sp.profiles[:]
            sp.profiles.extend(kept)
    return copy


def expected_of(samples: list[PcSample]) -> Counter[Key]:
    return Counter(
        {(s.cubin_crc, s.function_name, s.pc_offset, r): n for s in samples for r, n in s.stalls.items() if n}
    )
