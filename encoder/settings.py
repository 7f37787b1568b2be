"""The `backbone` config node, checked against `Encoder`'s constructor (types, ranges, choices) before anything is
loaded."""

from __future__ import annotations

from promptemb.common.validation import check_node, parameter_hints
from promptemb.encoder.model import Encoder


def check_backbone(container: dict) -> None:
    check_node("backbone.", container.get("backbone") or {}, parameter_hints(Encoder)[0], False,
               "Encoder (the backbone)")
