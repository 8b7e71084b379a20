"""Which CUPTI activity attributes an activity source's config sets: those it leaves out keep
CUPTI's defaults (per-thread buffers are CUPTI 13's, so ``per_thread_buffers`` unset must not
write the attribute at all)."""

from __future__ import annotations

import pytest

from cuptistream.config import load
from cuptistream.errors import ConfigError
from cuptistream.sources.activity.config import ATTRIBUTES, ActivitySourceConfig, attribute_values


def _activity(**keys: object) -> ActivitySourceConfig:
    config = load({"sinks": [{"type": "null"}], "sources": [{"type": "activity", **keys}]})
    source = config.sources[0]
    assert isinstance(source, ActivitySourceConfig)
    return source


def test_the_default_config_leaves_every_attribute_to_cupti() -> None:
    assert attribute_values(_activity()) == {}


@pytest.mark.parametrize(("value", "written"), [(False, 0), (True, 1)])
def test_per_thread_buffers_is_written_either_way_when_given(value: bool, written: int) -> None:
    values = attribute_values(_activity(per_thread_buffers=value))
    assert values == {"per_thread_buffer": written}
    assert ATTRIBUTES["per_thread_buffer"][0] == 9  # CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER


def test_named_keys_win_over_the_same_attribute_in_attributes() -> None:
    cfg = _activity(attributes={"per_thread_buffer": 1, "zeroed_out_buffer": 1}, per_thread_buffers=False,
                    device_buffer_size="8MiB")  # fmt: skip
    assert attribute_values(cfg) == {
        "per_thread_buffer": 0, "zeroed_out_buffer": 1, "device_buffer_size": 8 * 1024 * 1024,
    }  # fmt: skip


def test_a_per_thread_buffers_value_that_is_not_a_bool_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        _activity(per_thread_buffers="sometimes")
    message = str(info.value)
    assert "per_thread_buffers" in message and "\n" not in message
