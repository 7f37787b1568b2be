"""The type work that pydantic does for the config checker (common/validation.py), where a YAML value and a hint
meet in ways pydantic would otherwise judge differently from the checker's contract: a literal keeps its type, a class
no YAML value can be is left to the constructor, a mapping's entries are not looked into, numbers are finite."""

import math
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.common.validation import check_value

PRECISION = Literal[64, 32, 16] | Literal["16-mixed", "bf16-mixed", "32-true"] | Literal["64", "32", "16"] | None


def fits(value, hint) -> bool:
    try:
        check_value("key", value, hint)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("value, valid", [(16, True), ("16", True), ("bf16-mixed", True), (None, True),
                                          (16.0, False), (True, False), ("bf16", False)])
def test_a_literal_keeps_its_type(value, valid):
    assert fits(value, PRECISION) is valid
    assert fits(1, Literal[True]) is False and fits(True, Literal[1]) is False


def test_the_literals_of_a_union_are_named_together():
    with pytest.raises(ConfigError, match=r"^key='bf16': Input should be 64, 32, 16, '16-mixed', 'bf16-mixed', "
                                          r"'32-true', '64', '32' or '16'$"):
        check_value("key", "bf16", PRECISION)


def test_classes_are_left_to_the_constructor_but_refuse_a_scalar_beside_other_arms():
    assert fits({"_target_": "x.Y"}, torch.Tensor) and fits("anything", torch.Tensor)
    assert fits([0.9, {"_target_": "torch.tensor"}], tuple[float | torch.Tensor, float | torch.Tensor])
    assert not fits(["fast", 0.9], tuple[float | torch.Tensor, float | torch.Tensor])
    assert fits("00:01:00:00", str | timedelta | None) and not fits(3, str | timedelta | None)
    assert fits({"hours": "one"}, str | dict[str, int] | None)  # the entries are the constructor's business


def test_paths_are_strings_and_sequences_are_lists():
    assert fits("logs", str | Path) and fits("logs", Path) and not fits(1, Path)
    with pytest.raises(ConfigError, match=r"^x\.poolers='mean': Input should be a valid list$"):
        check_value("x.poolers", "mean", list[str] | tuple[str, ...])


@pytest.mark.parametrize("hint", [float, Any, torch.Tensor, float | None])
def test_numbers_are_finite_whatever_the_hint(hint):
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match=r": Input should be a finite number$"):
            check_value("key", value, hint)
