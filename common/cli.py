"""Command-line helpers shared by the Hydra entry points."""

from __future__ import annotations

import re

#: Config keys whose values are free text (prompt templates contain `"`, `'`, `[`, `]`, `:`).
FREE_TEXT_KEYS = ("template",)


def quote_free_text_overrides(argv: list[str], keys: tuple[str, ...] = FREE_TEXT_KEYS) -> list[str]:
    """Quote free-text override values for Hydra's grammar, so that the natural shell spelling
    `template='This sentence : "[X]" means [MASK] .'` (the shell strips the outer quotes) works.

    Values already quoted for Hydra (`"template='...'"`) and `null` are left alone.
    """
    pattern = re.compile(rf"^(\+{{0,2}}(?:{'|'.join(map(re.escape, keys))}))=(.*)$", re.DOTALL)
    quoted = []
    for arg in argv:
        match = pattern.match(arg)
        if match:
            key, value = match.groups()
            already = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
            if value and value != "null" and not already:
                # Hydra treats a backslash as an escape only before a quote or the closing quote.
                escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", value).replace("'", "\\'")
                arg = f"{key}='{escaped}'"
        quoted.append(arg)
    return quoted
