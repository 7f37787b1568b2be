"""The `backbone` and `template` config nodes, checked before anything is loaded: the backbone against `Encoder`'s
constructor (types, bounds, choices), the template against `TemplateSettings` and against what uses it."""

from __future__ import annotations

from typing import ClassVar

import yaml

from promptemb.common.errors import ConfigError
from promptemb.common.validation import Settings, check_node, import_target
from promptemb.configs import CONFIG_DIR
from promptemb.encoder.template import SentenceRule


def check_backbone(container: dict) -> None:
    from promptemb.encoder.model import Encoder  # torch and transformers: after the cheaper checks

    check_node("backbone.", container.get("backbone") or {}, Encoder, "Encoder (the backbone)")


class TemplateSettings(Settings):
    """A `template` group option (configs/template/): one template, or a pair of training views."""

    described_as: ClassVar[str] = "a template option"

    text: str | None
    second_text: str | None
    sentence_rule: SentenceRule


def template_options(pairs: bool) -> list[str]:
    """Names of configs/template/ options that are pairs of views (`pairs`) or single templates."""
    names = []
    for path in sorted((CONFIG_DIR / "template").glob("*.yaml")):
        option = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if option.get("text") is not None and (option.get("second_text") is not None) == pairs:
            names.append(path.stem)
    return names


def check_template(container: dict, recipe: str | None) -> None:
    """The `template` node against what uses it: a training recipe (`recipe`: the LightningModule's `_target_`) takes
    as many templates as it has views; evaluate.py (`recipe` None) takes one template or none."""
    template = container.get("template") or {}
    given = [name for name in ("text", "second_text") if template.get(name) is not None]
    if recipe is None:
        if "second_text" in given:
            raise ConfigError("template.second_text is set (a pair of training views) but evaluate.py scores one "
                              "template: use a single template (template=" + "|".join(template_options(False)) +
                              ") or template.second_text=null")
        return
    views = getattr(import_target(recipe), "template_views", None)  # not importable: Hydra reports it when building
    if views is None or (len(given) == views and "text" in given) or (views == 0 and not given):
        return
    name = recipe.rsplit(".", 1)[-1]
    if views == 0:
        raise ConfigError(f"{name} prompts without a template (the plain sentence) but the template config gives "
                          f"{template.get('text')!r}; valid here: template=none")
    wanted = ("a pair of templates (template.text, template.second_text)" if views == 2
              else "one template (template.text)")
    got = {0: "no template", 1: "one template", 2: "a pair of templates"}[len(given)]
    raise ConfigError(f"{name} trains with {wanted} but the template config gives {got}; valid here: template="
                      + "|".join(template_options(views == 2)))
