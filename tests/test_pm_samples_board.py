"""PM samples handed between processes that see the same GPUs under other CUDA ordinals (pods of a
node with their own ``CUDA_VISIBLE_DEVICES``): the board keys them by device UUID, and each
connection takes those of the GPUs its process sees, relabelled with its own ordinal."""

from __future__ import annotations

import msgspec

from cuptistream.collector.pm_samples import SampleBoard, decode, device_key, for_process
from cuptistream.events import PmSamples

A, B = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-1111"


def _samples(device: int, value: float) -> PmSamples:
    return PmSamples(device_id=device, chip="GH100", metrics=["m"], starts=[10], ends=[20], values=[[value]])


def test_a_gpu_is_keyed_by_its_uuid_and_by_its_ordinal_only_when_unnamed() -> None:
    assert device_key(_samples(1, 0.0), {0: A, 1: B}) == B
    assert device_key(_samples(1, 0.0), {}) == "ordinal 1"


def test_each_process_gets_the_samples_of_the_gpus_it_sees_under_its_own_ordinal() -> None:
    board = SampleBoard()
    sampler = {0: A, 1: B}  # the sampling process sees both GPUs
    pod_b = {B: 0}  # a pod that sees only GPU B, as its device 0
    pod_a = {A: 0}
    inbox = board.subscribe()
    for device, value in ((0, 1.0), (1, 2.0)):
        samples = _samples(device, value)
        board.publish(samples, device_key(samples, sampler))
    published = inbox.take()
    assert [key for key, _ in published] == [A, B]

    seen_by_b = [payload for key, data in published if (payload := for_process(key, data, pod_b)) is not None]
    (only,) = [decode(payload) for payload in seen_by_b]
    assert only.device_id == 0 and only.values == [[2.0]], "GPU B's samples, as pod B's device 0"
    (from_a,) = [decode(p) for key, data in published if (p := for_process(key, data, pod_a)) is not None]
    assert from_a.device_id == 0 and from_a.values == [[1.0]]

    same = {A: 0, B: 1}
    assert [for_process(key, data, same) for key, data in published] == [data for _, data in published], (
        "a process that sees the GPUs as the sampler does gets the payloads unchanged"
    )


def test_samples_keyed_by_ordinal_or_a_process_without_uuids_join_by_ordinal() -> None:
    payload = msgspec.msgpack.encode(_samples(3, 5.0))
    assert for_process("ordinal 3", payload, {A: 0}) == payload
    assert for_process(A, payload, {}) == payload


def test_a_later_connection_gets_each_gpus_latest_samples() -> None:
    board = SampleBoard()
    for value in (1.0, 2.0):
        samples = _samples(0, value)
        board.publish(samples, device_key(samples, {0: A}))
    (latest,) = board.subscribe().take()
    assert latest[0] == A and decode(latest[1]).values == [[2.0]]
