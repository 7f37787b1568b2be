"""Run by tests/lightning_modules/test_llm2vec.py in separate processes: LLM2Vec's training steps
(`module.training_step`, as Lightning calls it) under real DistributedDataParallel over 2 gloo ranks, 4 examples each,
vs one process. argv: kind (contrastive | mntp), rank, world size, port, output prefix; env TINY_LLAMA: the model.

* contrastive: `LLM2VecContrastive` (views triplets, triplets with gradient caching in chunks of 1, dropout views
  with dropout 0, pooled as evaluated); one process steps once on the joined 8 examples per views.
* mntp: `LLM2VecMNTP` with each half's masks drawn from a fixed seed (`mask_seeds`: different counts of masked
  tokens); one process steps on each half alone (the per-rank gradients DDP averages) and runs `mntp_forward` on the
  two masked halves joined (the token mean over the joined batch, which DDP does not compute).
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.llm2vec import LLM2VecContrastive, LLM2VecMNTP
from tests.llm2vec_official_references import seed_lora

TRIPLETS = [("A man is playing a guitar.", "A man plays music.", "A woman is cooking."),
            ("the sun is shining", "it is sunny", "it is raining at night"),
            ("Stocks fell sharply on Monday", "Shares dropped on Monday", "Stocks rose on Monday"),
            ("two dogs run in a field", "dogs are running outside", "a cat sleeps indoors"),
            ("a woman slices onions", "someone cuts vegetables", "a woman is sleeping"),
            ("two kids are eating", "children eat food", "the kids are starving"),
            ("Why?", "what for", "because"),
            ("She said hello to the children", "she greeted the kids", "she ignored everyone")]
SENTENCES = [anchor for anchor, _, _ in TRIPLETS]
#: (views, gradient-caching chunk) of the DDP steps; one process runs each views without caching
CONTRASTIVE_CASES = (("triplets", None), ("triplets", 1), ("dropout", None))
#: MNTP: the masks of each half are drawn after torch.manual_seed(seed), `mask_seeds`' seeds, on every side
MASK_SEED = 100
MLM_PROBABILITY = 0.4
LORA = {"lora_r": 2, "lora_alpha": 4, "lora_dropout": 0.0}


def build(cls, model: str, **kwargs):
    """The recipe's module in float64 (InfoNCE's logits stay fp32: losses.py) with LoRA dropout 0 and a seeded
    adapter: peft starts B at zero, which leaves A without gradient; A ~ N(0, 0.2²), B ~ N(0, 0.02²) from a fixed
    generator, the same in every process whatever it built before (large B saturates InfoNCE's softmax)."""
    module = cls(model, **LORA, **kwargs)
    seed_lora(module.transformer)
    with torch.no_grad():
        for name, parameter in module.transformer.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.1)
    module.double()
    if "lm_head" in module.__dict__:  # MNTP's frozen head is not a submodule
        module.lm_head.double()
    return module.train()


class TrainingStep(torch.nn.Module):
    """What Lightning's DDP strategy does: `training_step` runs inside DDP's forward, the tensor it returns is
    back-propagated once and DDP all-reduces (averages) the gradients during that backward. `logged`: what the step
    logged as train/loss (the loss itself, before any world-size scaling)."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.logged = {}
        module.log = lambda name, value, **kwargs: self.logged.__setitem__(name, value)  # no Trainer attached

    def forward(self, batch):
        return self.module.training_step(batch, 0)


def step(module, batch, world: int) -> dict:
    """One training step (DDP-wrapped when world > 1): the logged loss, the tensor back-propagated and the LoRA
    gradients as they stand after the backward (averaged over the ranks under DDP)."""
    module.zero_grad(set_to_none=True)
    wrapper = TrainingStep(module)
    runner = torch.nn.parallel.DistributedDataParallel(wrapper) if world > 1 else wrapper
    returned = runner(batch)
    returned.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    assert grads and all("lora_" in name for name in grads)
    return {"loss": wrapper.logged["train/loss"].clone(), "returned": returned.detach().clone(), "grads": grads}


def halves(items: list, world: int, rank: int) -> list:
    local = len(items) // world
    return items[rank * local : (rank + 1) * local]


def contrastive(model: str, rank: int, world: int) -> dict:
    results = {}
    for views, chunk in CONTRASTIVE_CASES:
        if world == 1 and chunk is not None:
            continue  # the single process is the plain step of the joined batch
        # the official SimCSE mean averages each device batch's own padding (as the official per-device collator):
        # ranks and the joined batch pad to different widths, so these views are pooled as evaluated
        pooling = "evaluation" if views == "dropout" else "official"
        module = build(LLM2VecContrastive, model, views=views, attention_dropout=0.0, grad_cache_chunk_size=chunk,
                       train_pooling=pooling)
        batch = halves(TRIPLETS if views == "triplets" else SENTENCES, world, rank)
        results[(views, chunk)] = step(module, batch, world)
    return results


def masked(module, sentences: list[str], seed: int) -> dict:
    torch.manual_seed(seed)
    return module.mntp_batch(sentences)


def joined(parts: list[dict], pad_id: int) -> dict:
    """The masked halves in one batch, right-padded to a common width (padding: pad id, attention 0, label -100)."""
    width = max(part["input_ids"].shape[1] for part in parts)
    fill = {"input_ids": pad_id, "attention_mask": 0, "labels": -100}
    return {key: torch.cat([torch.nn.functional.pad(part[key], (0, width - part[key].shape[1]), value=value)
                            for part in parts]) for key, value in fill.items()}


def count(batch: dict) -> int:
    return int((batch["labels"] != -100).sum())


def mask_seeds(module) -> list[int]:
    """The seeds the two halves' masks are drawn from, the same in every process: the first half's MASK_SEED, the
    second's the first seed after it that masks a different, non-zero number of tokens (the case where the mean of
    the per-rank token means and the joined batch's token mean differ)."""
    first = count(masked(module, halves(SENTENCES, 2, 0), MASK_SEED))
    assert first > 0
    seed = MASK_SEED + 1
    while count(masked(module, halves(SENTENCES, 2, 1), seed)) in (0, first):
        seed += 1
    return [MASK_SEED, seed]


def mntp(model: str, rank: int, world: int) -> dict:
    module = build(LLM2VecMNTP, model, mlm_probability=MLM_PROBABILITY)
    seeds = mask_seeds(module)
    ranks = [rank] if world > 1 else [0, 1]  # one process: each half alone, as a rank would see it
    results = {}
    for half in ranks:
        sentences = halves(SENTENCES, 2, half)
        batch = masked(module, sentences, seeds[half])  # the masks training_step draws below
        torch.manual_seed(seeds[half])
        results[half] = {**step(module, sentences, world), "batch": batch}
    if world == 1:  # the token mean over the joined batch, with the same masks
        tokenizer = module.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        module.zero_grad()
        loss = module.mntp_forward(**joined([results[0]["batch"], results[1]["batch"]], pad_id))
        loss.backward()
        results["joined"] = {"loss": loss.detach(), "grads": {name: p.grad.clone() for name, p in
                                                              module.named_parameters() if p.requires_grad}}
    return results


def main(kind: str, rank: int, world: int, port: int, out: str) -> None:
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = (contrastive if kind == "contrastive" else mntp)(os.environ["TINY_LLAMA"], rank, world)
    if world > 1:
        dist.destroy_process_group()
    torch.save(results, f"{out}.{rank}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
