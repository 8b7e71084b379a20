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

from cuptistream.events import PcSample, PcSampleBatch
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
    return Counter(
        {
            (s.cubin_crc, s.function_name, s.pc_offset, r): n
            for s in captured()
            for r, n in s.stalls.items()
            if n
        }
    )


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
