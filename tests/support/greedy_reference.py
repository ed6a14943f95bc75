"""The prompts and the transformers greedy reference that the equality tests compare the native engine against."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from tests.support.tiny_models import VOCAB

MAX_TOKENS = 12
SHARED_PREFIX = [int(t) for t in torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(1))]


def make_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 5, 23, 64, 9]
    prompts = [[int(t) for t in torch.randint(3, VOCAB, (n,), generator=generator)] for n in lengths]
    prompts += [SHARED_PREFIX + [7, 8, 9], SHARED_PREFIX + [10, 11]]
    return prompts


PROMPTS = make_prompts()


def hf_greedy(folder: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt in prompts:
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                   pad_token_id=0)
        outputs.append(generated[0, len(prompt):].tolist())
    return outputs
