"""OptiPrompt: only the soft template trains; it is placed by offset even when the sentence repeats template words."""

import torch

from promptemb.encoder.inputs import SENTENCE, TEMPLATE, collate
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.optiprompt import OptiPrompt
from tests.helpers import assert_close_scaled

PROMPT = 'This sentence : "[X]" means [MASK] .'


def test_soft_template_placed_by_offset_not_by_token_id(tiny_bert):
    module = OptiPrompt(str(tiny_bert), template=PROMPT)
    with torch.no_grad():
        module.soft_template.vectors.add_(torch.randn_like(module.soft_template.vectors))
    builder = module.builders[0]
    sentence = 'this sentence means " this : means .'  # every template word appears in the sentence
    batch = collate(builder.build([sentence, "short"]), module.tokenizer.pad_token_id, module.tokenizer.mask_token_id)
    table = module.transformer.get_input_embeddings()
    embeds = module.soft_template(batch, table)
    template_ids = builder.prefix_ids + builder.suffix_ids
    for row in range(2):
        k = 0
        for t in range(batch.input_ids.shape[1]):
            role, token = int(batch.roles[row, t]), int(batch.input_ids[row, t])
            if role == TEMPLATE:
                is_mask = token == module.tokenizer.mask_token_id
                want = table.weight[token] if is_mask else module.soft_template.vectors[k]
                assert token == template_ids[k]
                k += 1
            else:
                want = table.weight[token]
            torch.testing.assert_close(embeds[row, t], want)
        assert k == len(template_ids)
    sentence_tokens = batch.input_ids[0][batch.roles[0] == SENTENCE]
    assert set(sentence_tokens.tolist()) & set(template_ids)  # the overlap the test is about


def test_only_the_soft_template_changes(tiny_bert):
    module = OptiPrompt(str(tiny_bert), template=PROMPT)
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trainable == ["soft_template.vectors"]
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    module.train()
    anchors, positives, _ = module.contrastive_views(["a cat sits on the mat", "the dog runs", "rain falls"])
    info_nce(anchors, positives).backward()
    optimizer.step()
    changed = [name for name, p in module.named_parameters() if not torch.equal(p, before[name])]
    assert changed == ["soft_template.vectors"]
    mask_rows = module.soft_template.is_mask.nonzero().flatten()
    assert mask_rows.numel() == 1  # the [MASK] slot is not a trainable input


def test_evaluation_encoder_uses_the_soft_template(tiny_bert):
    from promptemb.encoder.template import Template
    from promptemb.poolers.mask import MaskPooler

    module = OptiPrompt(str(tiny_bert), template=PROMPT).eval()
    with torch.no_grad():
        module.soft_template.vectors.add_(1.0)
        direct = module.pooled(["a cat sits"], module.builders[0], MaskPooler("mask"))
    via_encoder = module.evaluation_encoder().embed(["a cat sits"], [MaskPooler("mask")], Template(PROMPT))["mask"]
    # float32 forwards in two batch layouts: round-off of the embedding's largest entry
    assert_close_scaled(via_encoder, direct, 1e-5)
