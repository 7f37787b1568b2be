"""The type work that pydantic does for the config checker (common/validation.py), where a YAML value and a hint
meet in ways pydantic would otherwise judge differently from the checker's contract: a literal keeps its type, a class
no YAML value can be is left to the constructor, a mapping's entries are not looked into."""

from datetime import timedelta
from typing import Literal

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.common.validation import check_value, matches

PRECISION = Literal[64, 32, 16] | Literal["16-mixed", "bf16-mixed", "32-true"] | Literal["64", "32", "16"] | None


@pytest.mark.parametrize("value, fits", [(16, True), ("16", True), ("bf16-mixed", True), (None, True),
                                         (16.0, False), (True, False), ("bf16", False)])
def test_a_literal_keeps_its_type(value, fits):
    assert matches(value, PRECISION) is fits
    assert matches(1, Literal[True]) is False and matches(True, Literal[1]) is False


def test_classes_are_left_to_the_constructor_but_refuse_a_scalar_beside_other_arms():
    assert matches({"_target_": "x.Y"}, torch.Tensor) and matches("anything", torch.Tensor)
    assert matches([0.9, {"_target_": "torch.tensor"}], tuple[float | torch.Tensor, float | torch.Tensor])
    assert not matches(["fast", 0.9], tuple[float | torch.Tensor, float | torch.Tensor])
    assert matches("00:01:00:00", str | timedelta | None) and not matches(3, str | timedelta | None)
    assert matches({"hours": "one"}, str | dict[str, int] | None)  # the entries are the constructor's business


def test_paths_are_strings_and_sequences_are_lists():
    from pathlib import Path

    assert matches("logs", str | Path) and matches("logs", Path) and not matches(1, Path)
    with pytest.raises(ConfigError, match=r"^x\.poolers='mean' is not valid: poolers must be a list of strings$"):
        check_value("x.poolers", "mean", list[str] | tuple[str, ...])
