"""Bounds of numeric settings, written into the type hints of the constructors and settings that own them
(annotated-types constraints, which pydantic enforces: `batch_size: AtLeastOne = 64`). The config checker reads
them from those hints (`promptemb.common.validation`); a class we do not own gets its bounds from the module that
configures it (`declare_hints`)."""

from typing import Annotated

from annotated_types import Ge, Gt, Interval

AtLeastOne = Annotated[int, Ge(1)]
NonNegativeInt = Annotated[int, Ge(0)]
Positive = Annotated[float, Gt(0)]
NonNegative = Annotated[float, Ge(0)]
Fraction = Annotated[float, Interval(ge=0, le=1)]
#: what numpy, torch and Python's `random` all accept
Seed = Annotated[int, Interval(ge=0, le=2**32 - 1)]
#: a templated input's token limit: [CLS] + at least one token + [SEP]
TokenLimit = Annotated[int, Ge(3)]
