"""Writes the model card from the numbers a build measured, so no figure is typed by hand."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.training.answer_check import CLOSE_RATIO, repeats_four_words
from engine.training.evaluate import GradedAnswer
from engine.training.model import ModelShape

BUILD_RECORD = "build.json"
SAMPLE_COUNT = 10


@dataclass
class BuildResults:
    """Everything the card reports, filled in by the build as it measures it.

    `commands` lists every command that produced the current weights: one for a full
    build, two when the draft was re-distilled from an already trained target. `seconds`
    and `cpu_seconds` are wall and process CPU time per phase; `acceptance` maps a question
    set to (accepted, proposed) draft tokens; `baseline` is the target this build replaced,
    measured on the same held-out text (None when no `--compare-with` was given).
    `everyday_answers` and `follow_up_answers` are the answer check's second set and its follow-up
    pairs (empty in the records of builds made before the check had them).
    """

    commands: list[str]
    threads: int
    vocab_size: int
    corpus: dict[str, int]
    target: dict
    draft: dict
    baseline: dict | None
    seconds: dict[str, float]
    cpu_seconds: dict[str, float]
    num_speculative: int
    acceptance: dict[str, tuple[int, int]]
    draft_cost_ratio: float
    trained_answers: list[GradedAnswer]
    heldout_answers: list[GradedAnswer]
    suggested_answers: list[GradedAnswer]
    everyday_answers: list[GradedAnswer] = field(default_factory=list)
    follow_up_answers: list[GradedAnswer] = field(default_factory=list)


def rate(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / max(1, total):.0f}%)"


def recall_summary(results: BuildResults) -> str:
    """One line: on-topic and repetition rates on the trained and held-out question sets."""
    parts = []
    for name, answers in (("trained", results.trained_answers), ("held-out", results.heldout_answers)):
        on_topic = sum(a.on_topic for a in answers)
        repeats = sum(a.repeats for a in answers)
        parts.append(f"{name}: on topic {rate(on_topic, len(answers))}, repeats {rate(repeats, len(answers))}")
    return "; ".join(parts)


def answer_sets(results: BuildResults) -> list[tuple[str, list[GradedAnswer]]]:
    """The answer check's graded sets about trained entries, by name (the sets an older record lacks left out)."""
    sets = [("popular entries, fresh phrasings", results.trained_answers),
            ("popular entries, everyday phrasings", results.everyday_answers),
            ("follow-ups (the second question of a conversation)", results.follow_up_answers)]
    return [(name, answers) for name, answers in sets if answers]


def bar_rows(results: BuildResults) -> list[tuple[str, str, bool]]:
    """(bar, measured, met) for each bar of issue 45 that this build's numbers decide."""
    rows = []
    for name, answers in answer_sets(results):
        on_topic = sum(a.on_topic for a in answers) / len(answers)
        repeats = sum(a.repeats for a in answers) / len(answers)
        rows += [(f"{name}: on topic >= 85%", f"{100 * on_topic:.0f}%", on_topic >= 0.85),
                 (f"{name}: repeats 0%", f"{100 * repeats:.0f}%", repeats == 0)]
    accepted, proposed = results.acceptance.get("trained questions", (0, 0))
    acceptance = accepted / max(1, proposed)
    target_ppl, draft_ppl = results.target["ppl"], results.draft["ppl"]
    if results.baseline:
        rows.append((f"held-out ppl: target no worse than the replaced target's {results.baseline['ppl']:.2f}",
                     f"{target_ppl:.2f}", target_ppl <= results.baseline["ppl"]))
    rows += [
        ("held-out ppl: target clearly below the draft (at most 0.9x)", f"{target_ppl:.2f} vs {draft_ppl:.2f}",
         target_ppl <= 0.9 * draft_ppl),
        (f"draft greedy acceptance at k={results.num_speculative} on questions about trained entries >= 0.7",
         f"{acceptance:.2f}", acceptance >= 0.7),
        ("draft forward at batch 1 <= 1/3 of the target's", f"{results.draft_cost_ratio:.2f}x",
         results.draft_cost_ratio <= 1 / 3),
    ]
    return rows


MODEL_TABLE_HEADER = (
    "| model | params | hidden | layers | heads / KV heads | MLP | steps | tokens seen | train time (wall / CPU) "
    "| safetensors | held-out ppl |\n" + "| --- " * 11 + "|"
)


def model_row(name: str, info: dict) -> str:
    shape = info["shape"]
    return (
        f"| `{name}` | {info['params'] / 1e6:.2f}M | {shape.hidden} | {shape.layers} | "
        f"{shape.heads} / {shape.heads} | {shape.intermediate} | {info['steps']} | "
        f"{info['tokens'] / 1e6:.1f}M | {info['seconds'] / 60:.1f} / {info['cpu_seconds'] / 60:.1f} min | "
        f"{info['size_mb']:.1f} MB | {info['ppl']:.2f} |"
    )


def quoted(text: str) -> str:
    return "> " + text.replace("\n", "\n> ")


def sample_block(answer: GradedAnswer) -> str:
    verdict = "on topic" if answer.on_topic else "off topic"
    if answer.repeats:
        verdict += ", repeats a 4-word run"
    return (
        f"**Q:** {answer.question}\n\n**A (target, greedy; check: {verdict}, similarity "
        f"{answer.similarity:.2f}):**\n\n{quoted(answer.answer)}\n\n"
        f"<details><summary>reference documentation</summary>\n\n{answer.reference}\n\n</details>"
    )


def recall_rows(results: BuildResults) -> str:
    """The recall table's rows: each set about trained entries, then the held-out entries."""
    sets = answer_sets(results) + [("held-out entries, fresh phrasings", results.heldout_answers)]
    return "\n".join(recall_row(f"{len(answers)} {name}", answers) for name, answers in sets)


def recall_row(name: str, answers: list[GradedAnswer]) -> str:
    on_topic = sum(a.on_topic for a in answers)
    repeats = sum(a.repeats for a in answers)
    references = sum(repeats_four_words(a.reference) for a in answers)
    total = len(answers)
    return f"| {name} | {rate(on_topic, total)} | {rate(repeats, total)} | {rate(references, total)} |"


def training_passes(target: dict) -> str:
    """How the target's steps were spent: one pass (popular chats oversampled or not), or a recall pass after it."""
    passes = target.get("passes")
    if not passes:
        return "The target trains on documents and chats."
    share = passes.get("popular_share", 0.0)
    broad = (
        f"The target trains in one pass of {passes['broad']} steps over every document and chat, the popular "
        f"chats making up {share:.0%} of its windows and every other document and chat the rest, so that the "
        "entries people ask about come round again and again while the rest of the corpus is seen too."
        if share > 0 else
        f"The target trains in a broad pass of {passes['broad']} steps over every document and chat."
    )
    if not passes.get("recall", 0):
        return broad
    scattered = passes.get("scattered_copies", 0)
    scattered_chats = (
        f" and {scattered} more chats per popular entry asked as scattered questions (the name among a few "
        "words of the training phrasings, none of the fresh phrasings' words), so that the answer keys on the "
        "name alone"
        if scattered else ""
    )
    learning_rate = f" at a peak learning rate of {passes['recall_lr']:g}" if "recall_lr" in passes else ""
    return (
        f"{broad} Then a recall pass of {passes['recall']} steps{learning_rate} goes over the popular chats"
        f"{scattered_chats}, up to {passes['recall_replay']:.0%} of its windows replayed from the other documents "
        "and chats so that what the broad pass learned is kept."
    )


def draft_recipe(draft: dict) -> str:
    """What the draft was distilled on: documentation answers only, or the target's own replies too."""
    replies = draft.get("replies", 0)
    if not replies:
        return "The draft is distilled on the chats, half of its windows from the popular ones."
    return (
        f"The draft is distilled on the popular chats and on the target's own greedy replies to {replies} "
        "questions about trained entries (on-policy: what the target says when it does not recall, which is "
        "what a held-out question gets), plus as many windows again from the other chats."
    )


def baseline_note(baseline: dict | None) -> str:
    if not baseline:
        return ""
    return (
        f"On the same held-out text, the target this build replaced (`{baseline['source']}`, "
        f"{baseline['params'] / 1e6:.1f}M parameters, its own tokenizer) has perplexity {baseline['ppl']:.2f}."
    )


def rebuild_note(commands: list[str]) -> str:
    """Why a card may list more than one command: each later one continued from the weights the one before left."""
    if len(commands) < 2:
        return ""
    return (
        "\nEach later command continued from the weights the one before it left (`--add-recall-pass` gives a "
        "target trained without a recall pass that pass, then distills the draft again; `--reuse-target` "
        "distills only the draft). `make demo-model` runs the program's current recipe in one command.\n"
    )


def render_card(results: BuildResults) -> str:
    corpus = results.corpus
    wall, cpu = sum(results.seconds.values()), sum(results.cpu_seconds.values())
    phases = "\n".join(
        f"| {name} | {results.seconds[name] / 60:.1f} min | {results.cpu_seconds[name] / 60:.1f} min |"
        for name in results.seconds
    )
    acceptance = "\n".join(
        f"| {name} | {accepted} / {proposed} | **{accepted / max(1, proposed):.2f}** |"
        for name, (accepted, proposed) in results.acceptance.items()
    )
    stride = max(1, len(results.trained_answers) // SAMPLE_COUNT)
    samples = "\n\n".join(sample_block(a) for a in results.trained_answers[::stride][:SAMPLE_COUNT])
    bars = "\n".join(f"| {bar} | {measured} | {'met' if met else '**missed**'} |"
                     for bar, measured, met in bar_rows(results))
    suggested = "\n".join(
        f"| {a.question} | {'yes' if a.on_topic else 'no'} | {a.similarity:.2f} |" for a in results.suggested_answers
    )
    return f"""# Bundled demo models

Two small Llama models trained in this repository from text that every Python installation
carries: the standard library's documentation topics (`pydoc_data.topics`) and the
docstrings of its modules, classes, functions and methods. They let the playground run
anywhere on a CPU, and the pair demonstrates speculative decoding with a draft model.

- `demo-chat/`: the target, a chat model that recalls the documentation of the standard
  library names people ask about most (`json.dumps`, `os.path.join`, the `with` statement, ...).
- `demo-draft/`: the draft, distilled from the target's logits, same tokenizer.

This card is written by the build itself; every number below was measured by it.

## Bars

The targets this build was held to (issue 45), each decided by the figures further down:

| bar | measured | |
| --- | --- | --- |
{bars}

## Rebuild

```
{chr(10).join(results.commands)}
```
{rebuild_note(results.commands)}
Budgets are step counts, so a busy machine changes only the duration. This build took
**{wall / 60:.1f} min** of wall time and **{cpu / 60:.1f} min** of process CPU time with
{results.threads} threads (float32); on an idle {results.threads}-core machine that is about
**{cpu / results.threads / 60:.0f} min** (CPU time / {results.threads}).

| phase | wall | CPU |
| --- | --- | --- |
{phases}

## Models

{MODEL_TABLE_HEADER}
{model_row("demo-chat", results.target)}
{model_row("demo-draft", results.draft)}

Both use `LlamaForCausalLM` with multi-head attention (KV heads = heads), tied embeddings,
RoPE, context up to 1024 positions (trained on 256-token windows), and a byte-level BPE
tokenizer of {results.vocab_size} tokens with ChatML turns (`<|im_start|>role\\n...<|im_end|>\\n`);
`<|im_end|>` is the EOS token, `<|endoftext|>` separates documents (BOS and padding).
The draft has {results.draft['params'] / results.target['params']:.2f}x the target's parameters.
{baseline_note(results.baseline)}

## Data

| part | documents | chat examples | tokens |
| --- | --- | --- | --- |
| train | {corpus['train_text']} | {corpus['train_chats']} | {corpus['train_tokens'] / 1e6:.2f}M |
| held-out | {corpus['heldout_text']} | {corpus['heldout_chats']} | {corpus['heldout_tokens'] / 1e3:.0f}K |

Every documented thing is a plain document and two chat examples. A chat asks about it in
one of many phrasings people type ("what does json.dumps do", "How do I use `pathlib.Path`?",
"explain the with statement", with or without backticks, `()`, capitals or a final mark), and
the answer is the leading prose of its documentation, from its first sentence (about 280
characters at most), ending with the end-of-turn token. The {corpus['popular_entries']} popular
entries (`engine/training/popular.py`: builtins, statements, and the main functions and
classes of the commonly used modules) get {corpus['popular_copies']} more chats each, each
phrased anew, and open {corpus.get('follow_up_copies', 0)} two-question conversations each, whose second
question asks about another popular entry. {training_passes(results.target)} {draft_recipe(results.draft)}
Everything is deduplicated, then about 5% of the rest is held out by hashing the
top-level module or topic section, so held-out modules contribute nothing to training;
popular entries always train. Perplexity is measured on the held-out documents and chats.

## Recall (the answer check)

`engine/training/answer_check.py` compares the first sentence of a greedy answer with the
first sentence of the reference answer, word by word (case, backticks and punctuation
ignored): the answer is **on topic** when difflib's similarity ratio is at least
{CLOSE_RATIO} (the documented sentence or a close restatement). An answer **repeats** when
some run of four words occurs twice in it and more often than in the reference (documentation
that itself repeats a run may be quoted word for word; a loop may not). Questions use phrasings no training chat uses:
fresh ones ("I'd like to know what `json.dump` does.", "Remind me what functools.partial is"),
everyday ones over other popular entries ("how can I use glob.glob", "What is `heapq.merge` meant
for?"), and follow-ups: the model answers a first question, then is asked about another entry in
the same conversation ("Also, explain `glob.glob`."), half the time one of the same module; a
follow-up's answer also counts as a repeat when it opens like the first entry's documentation.

| questions | on topic | repeat a 4-word run | reference answers that do |
| --- | --- | --- | --- |
{recall_rows(results)}

Held-out entries were never trained on, so their on-topic rate shows that the model
recalls what it was taught rather than explaining unseen names; generalisation is
measured by the held-out perplexity above.

## Speculative decoding

Greedy draft-then-verify loop over the two HF models, {results.num_speculative} speculative
tokens per step, on the questions above:

| questions | accepted / proposed | acceptance |
| --- | --- | --- |
{acceptance}

One batch-1 decode step of the draft costs **{results.draft_cost_ratio:.2f}x** the target's
(median of interleaved timings of both HF models in one process, KV cache of 48 tokens).

## Suggested questions

The playground's example questions, graded by the same check:

| question | on topic | similarity |
| --- | --- | --- |
{suggested}

## Sample answers (popular entries, fresh phrasings, greedy)

{samples}

## Limits

A model this small recalls the documentation it was taught, in the words of that
documentation; about anything else it writes documentation-flavoured English that is
usually wrong. It is a demonstration of the serving engine, not a source of facts.
"""


def write_card(path: Path, results: BuildResults) -> None:
    path.write_text(render_card(results))
    path.with_name(BUILD_RECORD).write_text(json.dumps(asdict(results), indent=1) + "\n")


def read_build_record(folder: Path) -> BuildResults:
    """The results of the build that wrote `folder`, so a later step can extend them."""
    record = json.loads((folder / BUILD_RECORD).read_text())
    for model in ("target", "draft"):
        record[model]["shape"] = ModelShape(**record[model]["shape"])
    record["acceptance"] = {name: tuple(pair) for name, pair in record["acceptance"].items()}
    for answers in ("trained_answers", "heldout_answers", "suggested_answers", "everyday_answers",
                    "follow_up_answers"):
        record[answers] = [GradedAnswer(**answer) for answer in record.get(answers, [])]
    return BuildResults(**record)
