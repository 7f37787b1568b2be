"""The `backbone` config node, checked against `Encoder`'s constructor (types, ranges, choices) before anything is
loaded."""

from __future__ import annotations

from promptemb.common.validation import check_node, constructor_hints
from promptemb.encoder.model import Encoder


def check_backbone(container: dict) -> None:
    hints, _ = constructor_hints(Encoder)
    check_node("backbone.", container.get("backbone") or {}, hints, False, "Encoder (the backbone)")
