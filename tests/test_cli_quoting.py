import pytest
from hydra import compose, initialize_config_dir

from common.cli import quote_free_text_overrides
from tests.conftest import REPO


@pytest.mark.parametrize(
    "template",
    ['This sentence : "[X]" means [MASK] .', "This sentence : '[X]' means [MASK] .", 'a \\ "[X]" [MASK]'],
)
def test_shell_spelling_of_templates_reaches_config_verbatim(template):
    overrides = quote_free_text_overrides([f"template={template}", "poolers=[mean,mask]"])
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("evaluate", overrides=overrides)
    assert cfg.template == template
    assert list(cfg.poolers) == ["mean", "mask"]


def test_already_quoted_and_null_are_untouched():
    args = ["template='x [X] [MASK]'", "template=null", "prompt=promptbert_bert"]
    assert quote_free_text_overrides(args) == args
