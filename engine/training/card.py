"""Writes the model card from the numbers a build measured, so no figure is typed by hand."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.training.model import ModelShape

BUILD_RECORD = "build.json"


@dataclass
class BuildResults:
    """Everything the card reports, filled in by the build as it measures it.

    `commands` lists every command that produced the current weights: one for a full
    build, two when the draft was re-distilled from an already trained target.
    """

    commands: list[str]
    threads: int
    vocab_size: int
    corpus: dict[str, int]
    target: dict
    draft: dict
    seconds: dict[str, float]
    acceptance: tuple[int, int]
    num_speculative: int
    acceptance_prompts: int
    samples: list[tuple[str, str, str]]


MODEL_TABLE_HEADER = (
    "| model | params | hidden | layers | heads / KV heads | MLP | steps | tokens seen | train time "
    "| safetensors | held-out ppl |\n" + "| --- " * 11 + "|"
)


def model_row(name: str, info: dict) -> str:
    shape = info["shape"]
    return (
        f"| `{name}` | {info['params'] / 1e6:.2f}M | {shape.hidden} | {shape.layers} | "
        f"{shape.heads} / {shape.heads} | {shape.intermediate} | {info['steps']} | "
        f"{info['tokens'] / 1e6:.1f}M | {info['seconds'] / 60:.1f} min | "
        f"{info['size_mb']:.1f} MB | {info['ppl']:.2f} |"
    )


def render_card(results: BuildResults) -> str:
    accepted, proposed = results.acceptance
    rate = accepted / proposed if proposed else 0.0
    corpus = results.corpus
    samples = "\n\n".join(
        f"**Q:** {question}\n\n**A (target, greedy):**\n\n> "
        + answer.replace("\n", "\n> ")
        + f"\n\n<details><summary>reference documentation</summary>\n\n{reference}\n\n</details>"
        for question, answer, reference in results.samples
    )
    total = sum(results.seconds.values())
    timing = ", ".join(f"{name} {secs / 60:.1f} min" for name, secs in results.seconds.items())
    return f"""# Bundled demo models

Two small Llama models trained in this repository from text that every Python installation
carries: the standard library's documentation topics (`pydoc_data.topics`) and the
docstrings of its public modules, classes, functions and methods (read from the source
files with `ast`; nothing is imported). They let the playground run anywhere on a CPU, and
the pair demonstrates speculative decoding with a draft model.

- `demo-chat/`: the target, a chat model that answers questions about the standard library.
- `demo-draft/`: the draft, distilled from the target's logits, same tokenizer.

This card is written by the build itself; every number below was measured by it.

## Rebuild

```
{chr(10).join(results.commands)}
```

Build time on this machine ({results.threads} CPU threads, float32): **{total / 60:.1f} min**
({timing}).

## Models

{MODEL_TABLE_HEADER}
{model_row("demo-chat", results.target)}
{model_row("demo-draft", results.draft)}

Both use `LlamaForCausalLM` with multi-head attention (KV heads = heads), tied embeddings,
RoPE, context up to 1024 positions (trained on 256-token windows), and a byte-level BPE
tokenizer of {results.vocab_size} tokens with ChatML turns (`<|im_start|>role\\n...<|im_end|>\\n`);
`<|im_end|>` is the EOS token, `<|endoftext|>` separates documents (BOS and padding).
The draft has {results.draft['params'] / results.target['params']:.2f}x the target's parameters.

## Data

| part | documents | chat examples | tokens |
| --- | --- | --- | --- |
| train | {corpus['train_text']} | {corpus['train_chats']} | {corpus['train_tokens'] / 1e6:.2f}M |
| held-out | {corpus['heldout_text']} | {corpus['heldout_chats']} | {corpus['heldout_tokens'] / 1e3:.0f}K |

Chat examples ask about one documented thing in several phrasings ("What does the
`json.dumps` function do?", "Explain the `with` statement.", "What is the `collections`
module for?"). The answer opens with a sentence that repeats the name exactly as asked
and says where it lives ("The `json.dumps` function is defined in the `json` module."),
continues with the leading prose of its documentation (about 280 characters at most),
and ends with the end-of-turn token.
Every training entry is also asked about once under an invented name of the same shape
("Explain the `topcompilers.PaletteParent` class.", its mentions in the answer renamed too): those chats
can only be started by copying the name from the question, which is what a question about
an unseen module needs; the real names alone invite the model to recite memorised ones.
The target trains on documents and chats; the draft is distilled on the chats alone,
since chat replies are what it will be asked to predict. Everything is deduplicated, then
about 5% is held out by hashing the top-level module or topic name, so held-out modules
contribute nothing to training.
Perplexity is measured on the held-out documents and chats.

## Speculative decoding

Greedy draft-then-verify loop over the two HF models on {results.acceptance_prompts} held-out chat
questions, {results.num_speculative} speculative tokens per step: the draft proposed {proposed}
tokens and the target accepted {accepted}, an acceptance rate of **{rate:.2f}**.

## Sample answers (held-out questions, greedy)

{samples}

## Limits

A model this small writes documentation-flavoured English and often gets details wrong;
it is a demonstration of the serving engine, not a source of facts.
"""


def write_card(path: Path, results: BuildResults) -> None:
    path.write_text(render_card(results))
    path.with_name(BUILD_RECORD).write_text(json.dumps(asdict(results), indent=1) + "\n")


def read_build_record(folder: Path) -> BuildResults:
    """The results of the build that wrote `folder`, so a later step can extend them."""
    record = json.loads((folder / BUILD_RECORD).read_text())
    for model in ("target", "draft"):
        record[model]["shape"] = ModelShape(**record[model]["shape"])
    record["acceptance"] = tuple(record["acceptance"])
    record["samples"] = [tuple(sample) for sample in record["samples"]]
    return BuildResults(**record)
