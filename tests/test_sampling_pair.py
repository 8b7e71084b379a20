"""PC sampling and SASS are refused together in one process (a crash seen on the H100, see
cuptistream/cupti/sampling_pair.py); each alone, or one after the other, is fine."""

from __future__ import annotations

import pytest

from cuptistream.cupti import sampling_pair
from cuptistream.errors import UserError


def test_the_second_of_the_two_is_refused_in_one_line_and_the_first_can_be_followed() -> None:
    sampling_pair.claim("pc_sampling", "pcs")
    try:
        with pytest.raises(UserError) as error:
            sampling_pair.claim("sass", "sass")
        message = str(error.value)
        assert "sass cannot run while pc_sampling source 'pcs' runs" in message and "\n" not in message
    finally:
        sampling_pair.release("pc_sampling", "pcs")
    sampling_pair.claim("sass", "sass")  # after PC sampling stopped
    try:
        with pytest.raises(UserError, match="pc_sampling cannot run while sass source 'sass' runs"):
            sampling_pair.claim("pc_sampling", "pcs")
    finally:
        sampling_pair.release("sass", "sass")
    sampling_pair.claim("pc_sampling", "pcs")
    sampling_pair.release("pc_sampling", "pcs")


def test_releasing_another_sources_claim_changes_nothing() -> None:
    sampling_pair.claim("sass", "a")
    try:
        sampling_pair.release("sass", "b")
        with pytest.raises(UserError):
            sampling_pair.claim("pc_sampling", "pcs")
    finally:
        sampling_pair.release("sass", "a")
