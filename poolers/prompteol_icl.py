"""PromptEOL with an in-context demonstration (Jiang et al. 2023, kongds/scaling_sentemb): one worked example
`This sentence : "<sentence>" means in one word:"<word>".` written before the PromptEOL prompt."""

from __future__ import annotations

from promptemb.common.errors import ConfigError
from promptemb.encoder.template import SENTENCE_SLOT
from promptemb.poolers.decoder import PROMPTEOL, LastTokenPooler

#: kongds/scaling_sentemb@8567aa083c1b3c77586670f91e7f78eb80694ad3 run_icl.sh: the demonstration picked per model on
#: STS-B dev, verbatim (`_` for a space, `*sent_0*` for the sentence), as passed to evaluation.py's
#: `--mask_embedding_sentence_template`.
OFFICIAL_DEMONSTRATIONS = {
    "opt-125m": 'This_sentence_:_"A_man_is_smoking."_means_in_one_word:"Smoking".This_sentence_:_"*sent_0*"_means_in_'
                'one_word:"',
    "opt-350m": 'This_sentence_:_"A_man_is_playing_on_a_guitar_and_singing."_means_in_one_word:"Music".This_sentence_'
                ':_"*sent_0*"_means_in_one_word:"',
    "opt-1.3b": 'This_sentence_:_"relating_to_switzerland_or_its_people."_means_in_one_word:"Swiss".This_sentence_:_"'
                '*sent_0*"_means_in_one_word:"',
    "opt-2.7b": 'This_sentence_:_"A_jockey_riding_a_horse."_means_in_one_word:"Equestrian".This_sentence_:_"*sent_0*"'
                '_means_in_one_word:"',
    "opt-6.7b": 'This_sentence_:_"The_man_is_riding_a_horse."_means_in_one_word:"Horseback-riding".This_sentence_:_"'
                '*sent_0*"_means_in_one_word:"',
    "opt-13b": 'This_sentence_:_"meat_from_a_deer."_means_in_one_word:"Venison".This_sentence_:_"*sent_0*"_means_in_'
               'one_word:"',
    "opt-30b": 'This_sentence_:_"The_man_is_riding_a_motorcycle_down_the_road."_means_in_one_word:"Motorcycling".This'
               '_sentence_:_"*sent_0*"_means_in_one_word:"',
    "opt-66b": 'This_sentence_:_"of_or_relating_to_tutors_or_tutoring."_means_in_one_word:"Tutorial".This_sentence_:_"'
               '*sent_0*"_means_in_one_word:"',
}
#: the best STS average of the paper's in-context results (OPT-6.7B, 79.08)
DEFAULT_DEMONSTRATION = "opt-6.7b"
#: how the official code marks the sentence in a template
OFFICIAL_SLOT = "*sent_0*"


def from_official_spelling(text: str) -> str:
    """A scaling_sentemb template in this framework's spelling, as evaluation.py's batcher reads it: every `_` becomes
    a space (the template's only; the sentence filled in later keeps its own), `*cls*` and `*sep+*` go (the
    tokenizer adds its own special tokens), `*sent 0*` is the sentence (`[X]`)."""
    text = text.replace("_", " ").replace("*sep+*", "").replace("*cls*", "")
    return text.replace(OFFICIAL_SLOT.replace("_", " "), SENTENCE_SLOT)


def demonstration_template(demonstration: str) -> str:
    """The full template of a named demonstration, or of a template given in either spelling."""
    if demonstration in OFFICIAL_DEMONSTRATIONS:
        return from_official_spelling(OFFICIAL_DEMONSTRATIONS[demonstration])
    if OFFICIAL_SLOT in demonstration:
        return from_official_spelling(demonstration)
    if SENTENCE_SLOT in demonstration:
        return demonstration
    if " " in demonstration or '"' in demonstration:
        raise ConfigError(f"demonstration template {demonstration!r} has no {SENTENCE_SLOT} slot for the sentence; "
                          f"write the demonstration, then the prompt with {SENTENCE_SLOT}, e.g. 'This sentence : "
                          f"\"A man is smoking.\" means in one word:\"Smoking\".{PROMPTEOL}'")
    raise ConfigError(f"unknown demonstration {demonstration!r}; valid: {', '.join(OFFICIAL_DEMONSTRATIONS)}, or a "
                      f"template with {SENTENCE_SLOT} (or the official spelling with {OFFICIAL_SLOT})")


class DemonstrationPooler(LastTokenPooler):
    """PromptEOL with one in-context demonstration (Jiang et al. 2023, §3.2): e = h^(l)_T, the last token's state
    (layer -1, after the final norm) of `This sentence : "<demonstration>" means in one word:"<word>".This sentence
    : "[X]" means in one word:"`. The demonstration is joined to the prompt with no space after its closing `".`, as
    the official templates write it; `_` in the official spelling is a space. `demonstration` names one of the
    official run_icl.sh's demonstrations (opt-125m ... opt-66b; default opt-6.7b) or is a whole template with
    `[X]` (or `*sent_0*` in the official spelling)."""

    def __init__(self, name: str = "prompteol_icl", demonstration: str = DEFAULT_DEMONSTRATION, layer: int = -1,
                 sentence_rule: str = "prompteol",
                 paper: str = "Jiang et al. 2023, PromptEOL with in-context learning"):
        if not isinstance(demonstration, str):
            raise ConfigError(f"pooler {name!r}: demonstration must be a name or a template, got {demonstration!r}")
        super().__init__(name, layer, demonstration_template(demonstration), sentence_rule, paper)
        self.demonstration = demonstration if demonstration in OFFICIAL_DEMONSTRATIONS else "custom"

    def arguments(self) -> dict:
        return {**super().arguments(), "demonstration": self.demonstration}
