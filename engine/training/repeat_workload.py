"""`python -m engine.training.repeat_workload`: the n-gram benchmark's prompts (presets/repeat_prompts.jsonl).

Prompt lookup pays when a reply repeats text already in its context. Here a person asks the demo model about a
popular entry, reads its answer, and asks about the same entry again in other words: when the model recalls the
entry, its second answer restates the first word for word. Each prompt is that conversation up to the second
question; the first answer is the bundled target's own greedy reply (run here with transformers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.training.corpus import build_corpus
from engine.training.evaluate import greedy_answer
from engine.training.questions import fresh_question, write_prompt_file


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.training.repeat_workload", description=__doc__)
    parser.add_argument("--model", type=Path, default=Path("assets/models/demo-chat"))
    parser.add_argument("--out", type=Path, default=Path("presets/repeat_prompts.jsonl"))
    parser.add_argument("--count", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    popular = build_corpus(popular_copies=1).popular
    picked = popular[::max(1, len(popular) // args.count)][:args.count]
    conversations = []
    for index, entry in enumerate(picked):
        first, again = fresh_question(entry.kind, entry.name, index), fresh_question(entry.kind, entry.name, index + 1)
        conversations.append([{"role": "user", "content": first},
                              {"role": "assistant", "content": greedy_answer(model, tokenizer, first)},
                              {"role": "user", "content": again}])
    write_prompt_file(args.out, conversations)
    print(f"wrote {len(conversations)} conversations to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
