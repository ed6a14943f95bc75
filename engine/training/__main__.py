"""`python -m engine.training`: corpus -> tokenizer -> target -> distilled draft -> evaluation -> card.

Budgets are step counts, so the result does not depend on how busy the machine is; the build
records wall and process CPU seconds of each phase. The target trains in a broad pass, then a
short recall pass over the popular chats. `--reuse-target` keeps an earlier build's target and
re-distills only the draft; `--add-recall-pass` gives an earlier build's target (one trained
without a recall pass) its recall pass, then re-distills the draft. The card then lists every
command behind the weights and the earlier build's figures (from build.json).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from engine.training.card import (
    BUILD_RECORD,
    BuildResults,
    draft_recipe,
    read_build_record,
    recall_summary,
    write_card,
)
from engine.training.corpus import (
    POPULAR_MIN_CHARS,
    answer_for,
    build_corpus,
    evenly_spread,
    everyday_cases,
    follow_up_cases,
    recall_cases,
)
from engine.training.distill import distillation_loss, target_replies
from engine.training.evaluate import (
    forward_cost_ratio,
    grade_answers,
    grade_follow_ups,
    perplexity,
    speculative_acceptance,
)
from engine.training.model import (
    DRAFT_SHAPE,
    TARGET_SHAPE,
    ModelShape,
    TrainReport,
    TrainSettings,
    build_model,
    combined_report,
    count_parameters,
    oversampled_mix,
    replay_mix,
    token_stream,
    train,
    windows,
)
from engine.training.popular import DEFAULT_POPULAR_ENTRIES, SUGGESTED_QUESTIONS
from engine.training.questions import training_questions, write_prompt_file
from engine.training.tokenizer import train_tokenizer

SEQ_LEN = 256
HELDOUT_SAMPLE = "demo-heldout.json"
CHAT_QUESTIONS = "demo-questions.jsonl"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.training", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("assets/models"))
    parser.add_argument("--vocab-size", type=int, default=6144)
    parser.add_argument("--target-steps", type=int, default=3600,
                        help="steps of the target's broad pass over every document and chat")
    parser.add_argument("--popular-share", type=float, default=0.75,
                        help="share of the broad pass's windows drawn from the popular chats (repeated to fill it); "
                             "the rest are every other document and chat")
    parser.add_argument("--recall-steps", type=int, default=450,
                        help="steps of the target's second pass over the popular and scattered chats (plus "
                             "replayed windows of the other documents and chats); 0 skips it")
    parser.add_argument("--recall-replay", type=float, default=0.5,
                        help="share of the recall pass's windows replayed from the other documents and chats (at "
                             "most each of them once)")
    parser.add_argument("--recall-lr", type=float, default=5e-4, help="peak learning rate of the recall pass")
    parser.add_argument("--scattered-copies", type=int, default=20,
                        help="chats per popular entry for the recall pass whose question is the name among a few "
                             "stray words of the training phrasings")
    parser.add_argument("--draft-steps", type=int, default=1400)
    parser.add_argument("--draft-replies", type=int, default=3000,
                        help="questions about trained entries whose greedy target replies the draft also "
                             "distills on (on-policy); 0 distills on documentation answers only")
    parser.add_argument("--popular-copies", type=int, default=80,
                        help="extra chats per popular entry, each phrased anew")
    parser.add_argument("--follow-up-copies", type=int, default=30,
                        help="two-question conversations opening with each popular entry (the second about "
                             "another entry, half the time one of the same module or the module itself)")
    parser.add_argument("--popular-entries", type=int, default=DEFAULT_POPULAR_ENTRIES,
                        help="keep about this many popular entries (the leading share of every curated group)")
    parser.add_argument("--limit", type=int, help="use only this many docstrings (quick trial runs)")
    parser.add_argument("--recall-questions", type=int, default=50)
    parser.add_argument("--everyday-questions", type=int, default=60,
                        help="popular entries the answer check's second set asks in everyday phrasings")
    parser.add_argument("--follow-up-questions", type=int, default=40,
                        help="two-question conversations the answer check grades the second answer of")
    parser.add_argument("--compare-with", type=Path,
                        help="an earlier target folder whose held-out perplexity (with its own tokenizer) "
                             "is measured on this build's held-out text before anything is overwritten")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    kept = parser.add_mutually_exclusive_group()
    kept.add_argument(
        "--reuse-target", action="store_true",
        help=f"keep the target (and tokenizer) in --out, re-distill only the draft; needs its {BUILD_RECORD}",
    )
    kept.add_argument(
        "--add-recall-pass", action="store_true",
        help=f"give the target in --out, trained without a recall pass, its recall pass, then re-distill the "
             f"draft; needs its {BUILD_RECORD}",
    )
    return parser.parse_args(argv)


def save(model, tokenizer, folder: Path) -> float:
    """Writes an HF folder (weights, config, generation config, tokenizer); returns MB of weights."""
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(folder)
    for how_it_was_loaded in ("is_local", "local_files_only"):  # a kept tokenizer would write these into its config
        tokenizer.init_kwargs.pop(how_it_was_loaded, None)
    tokenizer.save_pretrained(folder)
    return (folder / "model.safetensors").stat().st_size / 1e6


def model_facts(params: int, shape: ModelShape, report: TrainReport, size_mb: float) -> dict:
    """One model's row of the card (held-out perplexity is added once it is measured)."""
    return {"params": params, "shape": shape, "steps": report.steps, "tokens": report.tokens,
            "seconds": report.seconds, "cpu_seconds": report.cpu_seconds, "size_mb": size_mb}


def baseline_perplexity(folder: Path, corpus) -> dict:
    """Held-out perplexity of an earlier target on this build's held-out text, tokenized its own way."""
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    stream = token_stream(tokenizer, corpus.heldout_text, corpus.heldout_chats)
    return {"source": folder.as_posix(), "params": count_parameters(model),
            "ppl": perplexity(model, windows(stream, SEQ_LEN))}


def write_heldout_sample(path: Path, corpus, tokenizer) -> None:
    """The held-out text the serving engine's perplexity figure uses by default (`Engine.perplexity()`)."""
    texts = corpus.heldout_text + [tokenizer.apply_chat_template(chat, tokenize=False) for chat in corpus.heldout_chats]
    about = (
        "Held-out text of the demo model's corpus, the default text of Engine.perplexity(). The training program "
        "(engine/training/corpus.py, build_corpus) holds out every stdlib module or topic section whose name "
        "hashes into 5%, except the popular names, which always train; neither model of the demo pair trained on "
        "any of it. This file keeps every held-out document, then every held-out chat rendered with the demo chat "
        "template. Written by the build (python -m engine.training) from this Python's standard library."
    )
    path.write_text(json.dumps({"about": about, "texts": texts}, indent=1, ensure_ascii=False) + "\n")


def write_chat_questions(path: Path, cases: list[tuple[str, str]]) -> None:
    """The graded questions about trained entries (fresh phrasings) as a prompt file: what `--dataset chat`
    asks the demo model (presets/models.toml `chat_prompts`), so benchmarks ask what it was taught."""
    write_prompt_file(path, [[{"role": "user", "content": question}] for question, _ in cases])


def reply_questions(corpus, count: int) -> list[str]:
    """One training-style question each about `count` trained entries spread evenly over all of them."""
    return [training_questions(e.kind, e.name, 1, "on-policy")[0] for e in evenly_spread(corpus.train_entries, count)]


def recall_pass(target, focus: torch.Tensor, rest: torch.Tensor, args: argparse.Namespace) -> TrainReport:
    """The target's second pass: the popular and scattered chats, `--recall-replay` of it replayed from the other
    documents and chats, each taken at most once (not the first pass's mix, which is mostly popular chats:
    replaying that kept the rest of the corpus too little: held-out perplexity 116.0 against 104.4 for the same
    pass replaying every window once)."""
    print(f"training the target: recall pass over the popular and scattered chats ({args.recall_steps} steps)")
    data = replay_mix(focus, rest, args.recall_replay, args.seed + 2)
    return train(target, data, TrainSettings(steps=args.recall_steps, lr=args.recall_lr, seed=args.seed + 2))


def with_recall_pass(target_info: dict, report: TrainReport, args: argparse.Namespace) -> dict:
    """An earlier build's target row, extended by the recall pass it was just given."""
    info = dict(target_info)
    for key in ("steps", "tokens", "seconds", "cpu_seconds"):
        info[key] += getattr(report, key)
    info["passes"] = dict(info["passes"], recall=args.recall_steps, recall_replay=args.recall_replay,
                          recall_lr=args.recall_lr, scattered_copies=args.scattered_copies)
    return info


def load_target(folder: Path, record: BuildResults):
    """The trained target and tokenizer of an earlier build, for re-distilling the draft."""
    target = AutoModelForCausalLM.from_pretrained(folder / "demo-chat", local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder / "demo-chat", local_files_only=True)
    config = target.config
    loaded = ModelShape(config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                        config.intermediate_size)
    if loaded != record.target["shape"]:
        raise SystemExit(f"{folder / 'demo-chat'} does not match the target recorded in {BUILD_RECORD}")
    return target, tokenizer


class Clock:
    """Wall and process CPU seconds per phase (CPU seconds / threads estimates an idle machine)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._marks = (time.perf_counter(), time.process_time())

    def lap(self, phase: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall[phase] = wall - self._marks[0]
        self.cpu[phase] = cpu - self._marks[1]
        self._marks = (wall, cpu)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress reaches a redirected log as it happens
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    command = "python -m engine.training " + shlex.join(argv)
    clock = Clock()

    corpus = build_corpus(limit=args.limit, popular_copies=args.popular_copies, popular_limit=args.popular_entries,
                          scattered_copies=args.scattered_copies, follow_up_copies=args.follow_up_copies)
    previous = read_build_record(args.out) if args.reuse_target or args.add_recall_pass else None
    if previous and args.add_recall_pass and previous.target["passes"].get("recall", 0) > 0:
        raise SystemExit(f"the target in {args.out} already had its recall pass")
    if previous:
        baseline = previous.baseline
    elif args.compare_with and (args.compare_with / "config.json").is_file():
        baseline = baseline_perplexity(args.compare_with, corpus)
    else:
        baseline = None
    if previous:
        target, tokenizer = load_target(args.out, previous)
    else:
        tokenizer_texts = corpus.train_text + [m["content"] for c in corpus.train_chats for m in c]
        tokenizer = train_tokenizer(tokenizer_texts, args.vocab_size)
        target = build_model(TARGET_SHAPE, tokenizer)
    # Each part tokenized once; a stream of several parts is their streams end to end (what token_stream gives).
    text_stream = token_stream(tokenizer, corpus.train_text, [])
    other_chat_stream = token_stream(tokenizer, [], corpus.train_chats)
    popular_stream = token_stream(tokenizer, [], corpus.popular_chats)
    train_stream = torch.cat([text_stream, other_chat_stream, popular_stream])
    chat_data = windows(torch.cat([other_chat_stream, popular_stream]), SEQ_LEN)
    popular_data = windows(popular_stream, SEQ_LEN)
    recall_data = windows(torch.cat([popular_stream, token_stream(tokenizer, [], corpus.scattered_chats)]), SEQ_LEN)
    rest_data = windows(torch.cat([text_stream, other_chat_stream]), SEQ_LEN)
    heldout_stream = token_stream(tokenizer, corpus.heldout_text, corpus.heldout_chats)
    heldout_data = windows(heldout_stream, SEQ_LEN)
    clock.lap("corpus + tokenizer")
    print(f"corpus: {len(corpus.popular)} popular entries, {len(train_stream)} train tokens "
          f"({chat_data[:, 1:].numel()} in chats), {len(heldout_stream)} held-out tokens")

    draft = build_model(DRAFT_SHAPE, tokenizer)
    target_params, draft_params = count_parameters(target), count_parameters(draft)
    if draft_params * 5 > target_params:
        raise SystemExit(f"draft has {draft_params} params, more than 1/5 of {target_params}")
    print(f"target {target_params / 1e6:.2f}M params, draft {draft_params / 1e6:.2f}M params")

    if previous:
        target_commands = previous.target.get("commands", previous.commands[:1])
        for phase in [name for name in previous.seconds if name not in ("draft", "evaluation")]:
            clock.wall[phase], clock.cpu[phase] = previous.seconds[phase], previous.cpu_seconds[phase]
        target_info = previous.target
        if args.add_recall_pass:
            target_info = with_recall_pass(target_info, recall_pass(target, recall_data, rest_data, args), args)
            target_info["size_mb"] = save(target, tokenizer, args.out / "demo-chat")
            target_commands = [*target_commands, command]
            clock.lap("target recall pass")
    else:
        first_pass = (oversampled_mix(popular_data, rest_data, args.popular_share, args.seed + 4)
                      if args.popular_share > 0 else windows(train_stream, SEQ_LEN))
        print(f"training the target: broad pass over documents and chats ({args.popular_share:.0%} popular)")
        reports = [train(target, first_pass, TrainSettings(steps=args.target_steps, seed=args.seed))]
        clock.lap("target")
        if args.recall_steps > 0:
            reports.append(recall_pass(target, recall_data, rest_data, args))
            clock.lap("target recall pass")
        target_commands = [command]
        target_info = model_facts(target_params, TARGET_SHAPE, combined_report(*reports),
                                  save(target, tokenizer, args.out / "demo-chat"))
        target_info["passes"] = {"broad": args.target_steps, "popular_share": args.popular_share,
                                 "recall": args.recall_steps, "recall_replay": args.recall_replay,
                                 "recall_lr": args.recall_lr, "scattered_copies": args.scattered_copies}
    target_info["commands"] = target_commands
    commands = [*target_commands, command] if args.reuse_target else target_commands

    draft_focus = popular_data
    if args.draft_replies > 0:
        print(f"generating the target's greedy replies to {args.draft_replies} questions for the draft")
        replies = target_replies(target, tokenizer, reply_questions(corpus, args.draft_replies))
        draft_focus = torch.cat([popular_data, windows(token_stream(tokenizer, [], replies), SEQ_LEN)])
    print(f"distilling the draft. {draft_recipe({'replies': args.draft_replies})}")
    report = train(draft, replay_mix(draft_focus, chat_data, 0.5, args.seed + 3),
                   TrainSettings(steps=args.draft_steps, lr=3e-3, seed=args.seed + 1),
                   loss_fn=distillation_loss(target))
    draft_info = model_facts(draft_params, DRAFT_SHAPE, report, save(draft, tokenizer, args.out / "demo-draft"))
    draft_info["replies"] = args.draft_replies
    clock.lap("draft")

    print("evaluating")
    trained_cases = recall_cases(corpus.popular, args.recall_questions, POPULAR_MIN_CHARS)
    heldout_cases = recall_cases(corpus.heldout_entries, args.recall_questions)
    trained = grade_answers(target, tokenizer, trained_cases)
    heldout = grade_answers(target, tokenizer, heldout_cases)
    everyday = grade_answers(target, tokenizer, everyday_cases(corpus.popular, args.everyday_questions))
    follow_ups = grade_follow_ups(target, tokenizer, follow_up_cases(corpus.popular, args.follow_up_questions))
    references = {entry.name: answer_for(entry, POPULAR_MIN_CHARS) for entry in corpus.popular}
    suggested_cases = [(q, references[name]) for q, name in SUGGESTED_QUESTIONS if name in references]
    suggested = grade_answers(target, tokenizer, suggested_cases)
    target_info["ppl"] = perplexity(target, heldout_data)
    draft_info["ppl"] = perplexity(draft, heldout_data)
    acceptance = {
        "trained questions": speculative_acceptance(target, draft, tokenizer, [q for q, _ in trained_cases]),
        "held-out questions": speculative_acceptance(target, draft, tokenizer, [q for q, _ in heldout_cases]),
    }
    cost_ratio = forward_cost_ratio(draft, target)
    clock.lap("evaluation")

    results = BuildResults(
        commands=commands,
        threads=args.threads,
        vocab_size=len(tokenizer),
        corpus={
            "train_text": len(corpus.train_text), "train_chats": len(corpus.train_chats) + len(corpus.popular_chats),
            "heldout_text": len(corpus.heldout_text), "heldout_chats": len(corpus.heldout_chats),
            "train_tokens": len(train_stream), "heldout_tokens": len(heldout_stream),
            "popular_entries": len(corpus.popular), "popular_limit": args.popular_entries,
            "popular_copies": args.popular_copies, "scattered_chats": len(corpus.scattered_chats),
            "follow_up_copies": args.follow_up_copies,
        },
        target=target_info,
        draft=draft_info,
        baseline=baseline,
        seconds=clock.wall,
        cpu_seconds=clock.cpu,
        num_speculative=4,
        acceptance=acceptance,
        draft_cost_ratio=cost_ratio,
        trained_answers=trained,
        heldout_answers=heldout,
        suggested_answers=suggested,
        everyday_answers=everyday,
        follow_up_answers=follow_ups,
    )
    write_card(args.out / "README.md", results)
    write_heldout_sample(args.out / HELDOUT_SAMPLE, corpus, tokenizer)
    write_chat_questions(args.out / CHAT_QUESTIONS, trained_cases)
    print(f"done in {sum(clock.wall.values()) / 60:.1f} min ({sum(clock.cpu.values()) / 60:.1f} CPU-min): "
          f"ppl target {target_info['ppl']:.2f}, draft {draft_info['ppl']:.2f}; "
          f"{recall_summary(results)}; draft cost ratio {cost_ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
