"""The user's own modules: `imports=[my_recipes, my_poolers]` on any command imports them before its config is checked,
so the recipes, poolers and evaluation families they register (`@register_recipe`, `@register_pooler`,
`@register_family`) are known by name everywhere a built-in is. Installed packages can do the same through the
`promptemb.plugins` entry-point group (each entry point names a module to import), loaded once per process.

The current directory is searched after the installed packages, as `python -m` does, so a module beside the command
works without PYTHONPATH. Nothing is ever imported because a checkpoint or a file names it: a checkpoint of an
unregistered recipe is refused with the `imports=` that would register it (lightning_modules/checkpoint.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from promptemb.common.errors import ConfigError

ENTRY_POINT_GROUP = "promptemb.plugins"
_loaded_entry_points = False


def import_modules(names: Sequence[str] | None, key: str = "imports") -> None:
    """Import the installed plugins, then each module of `names` (a module name, `package.module`); a module that
    fails to import is one line naming it and why."""
    load_entry_points()
    if not names:
        return
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"{key} {name}: a module name such as my_recipes or my_package.poolers (not a path)"
                              if key.startswith("--") else
                              f"{key}=[{name}]: a module name such as my_recipes or my_package.poolers (not a path)")
        try:
            importlib.import_module(name)
        except ConfigError as err:  # a registration it makes is refused (a name taken by a built-in)
            raise ConfigError(f"{key}=[{name}]: {err}") from None
        except Exception as err:
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            where = "" if isinstance(err, ModuleNotFoundError) and err.name == name else " (an error inside it)"
            raise ConfigError(f"{key}=[{name}]: the module failed to import{where}: {type(err).__name__}: "
                              f"{reason}") from None


def load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:
            raise ConfigError(f"the installed plugin {entry.name!r} ({entry.value}, a {ENTRY_POINT_GROUP} entry point) "
                              f"failed to import: {type(err).__name__}: {str(err).strip()[:200]}") from None
