"""`python -m engine.training`: corpus -> tokenizer -> target -> distilled draft -> card.

`--reuse-target` keeps an earlier build's target and re-distills only the draft; the
card then lists both commands and the earlier build's target figures (from build.json).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from engine.training.card import BUILD_RECORD, BuildResults, read_build_record, write_card
from engine.training.corpus import as_chats, build_corpus
from engine.training.distill import distillation_loss
from engine.training.evaluate import greedy_answer, perplexity, speculative_acceptance
from engine.training.model import (
    DRAFT_SHAPE,
    TARGET_SHAPE,
    ModelShape,
    TrainReport,
    TrainSettings,
    build_model,
    count_parameters,
    token_stream,
    train,
    windows,
)
from engine.training.tokenizer import train_tokenizer

SAMPLE_KINDS = ["topic", "module", "function", "class", "method"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.training", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("assets/models"))
    parser.add_argument("--vocab-size", type=int, default=6144)
    parser.add_argument("--target-minutes", type=float, default=32.0)
    parser.add_argument("--draft-minutes", type=float, default=24.0)
    parser.add_argument("--target-steps", type=int, help="fixed step count (default: fit the minutes)")
    parser.add_argument("--draft-steps", type=int, help="fixed step count (default: fit the minutes)")
    parser.add_argument("--limit", type=int, help="use only this many docstrings (quick trial runs)")
    parser.add_argument("--acceptance-prompts", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reuse-target", action="store_true",
        help=f"keep the target (and tokenizer) in --out, re-distill only the draft; needs its {BUILD_RECORD}",
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
    tokenizer.save_pretrained(folder)
    return (folder / "model.safetensors").stat().st_size / 1e6


def sample_questions(corpus) -> list[tuple[str, str]]:
    """One held-out question per kind of documented thing, with the reference answer."""
    picked = []
    for kind in SAMPLE_KINDS:
        for entry in corpus.heldout_entries:
            chats = as_chats(entry, 1) if entry.kind == kind else []
            if chats:
                picked.append((chats[0][0]["content"], chats[0][1]["content"]))
                break
    return picked


def model_facts(params: int, shape: ModelShape, report: TrainReport, size_mb: float) -> dict:
    """One model's row of the card (held-out perplexity is added once it is measured)."""
    return {"params": params, "shape": shape, "steps": report.steps, "tokens": report.tokens,
            "seconds": report.seconds, "size_mb": size_mb}


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


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress reaches a redirected log as it happens
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    command = "python -m engine.training " + shlex.join(argv)
    started = time.perf_counter()

    corpus = build_corpus(limit=args.limit)
    previous = read_build_record(args.out) if args.reuse_target else None
    if previous:
        target, tokenizer = load_target(args.out, previous)
    else:
        tokenizer_texts = corpus.train_text + [m["content"] for c in corpus.train_chats for m in c]
        tokenizer = train_tokenizer(tokenizer_texts, args.vocab_size)
        target = build_model(TARGET_SHAPE, tokenizer)
    seq_len = TrainSettings(minutes=0).seq_len
    train_stream = token_stream(tokenizer, corpus.train_text, corpus.train_chats)
    chat_data = windows(token_stream(tokenizer, [], corpus.train_chats), seq_len)
    heldout_stream = token_stream(tokenizer, corpus.heldout_text, corpus.heldout_chats)
    heldout_data = windows(heldout_stream, seq_len)
    preparation_seconds = time.perf_counter() - started
    print(f"corpus: {len(train_stream)} train tokens ({chat_data[:, 1:].numel()} in chats), "
          f"{len(heldout_stream)} held-out tokens")

    draft = build_model(DRAFT_SHAPE, tokenizer)
    target_params, draft_params = count_parameters(target), count_parameters(draft)
    if draft_params * 5 > target_params:
        raise SystemExit(f"draft has {draft_params} params, more than 1/5 of {target_params}")
    print(f"target {target_params / 1e6:.2f}M params, draft {draft_params / 1e6:.2f}M params")

    if previous:
        commands = [previous.commands[0], command]
        seconds = {"corpus + tokenizer": previous.seconds["corpus + tokenizer"], "target": previous.target["seconds"]}
        target_info = previous.target
    else:
        print("training the target")
        target_report = train(
            target, windows(train_stream, seq_len),
            TrainSettings(minutes=args.target_minutes, steps=args.target_steps, seed=args.seed),
        )
        commands = [command]
        seconds = {"corpus + tokenizer": preparation_seconds, "target": target_report.seconds}
        target_info = model_facts(target_params, TARGET_SHAPE, target_report,
                                  save(target, tokenizer, args.out / "demo-chat"))

    print("distilling the draft on the chat turns")
    draft_report = train(
        draft, chat_data,
        TrainSettings(minutes=args.draft_minutes, steps=args.draft_steps, lr=3e-3, seed=args.seed + 1),
        loss_fn=distillation_loss(target),
    )
    seconds["draft"] = draft_report.seconds
    draft_info = model_facts(draft_params, DRAFT_SHAPE, draft_report, save(draft, tokenizer, args.out / "demo-draft"))

    print("evaluating")
    eval_start = time.perf_counter()
    questions = list(dict.fromkeys(chat[0]["content"] for chat in corpus.heldout_chats))
    stride = max(1, len(questions) // args.acceptance_prompts)
    acceptance_questions = questions[::stride][: args.acceptance_prompts]
    acceptance = speculative_acceptance(target, draft, tokenizer, acceptance_questions)
    samples = [(q, greedy_answer(target, tokenizer, q), ref) for q, ref in sample_questions(corpus)]
    target_info["ppl"] = perplexity(target, heldout_data)
    draft_info["ppl"] = perplexity(draft, heldout_data)
    seconds["evaluation"] = time.perf_counter() - eval_start

    results = BuildResults(
        commands=commands,
        threads=args.threads,
        vocab_size=len(tokenizer),
        corpus={
            "train_text": len(corpus.train_text), "train_chats": len(corpus.train_chats),
            "heldout_text": len(corpus.heldout_text), "heldout_chats": len(corpus.heldout_chats),
            "train_tokens": len(train_stream), "heldout_tokens": len(heldout_stream),
        },
        target=target_info,
        draft=draft_info,
        seconds=seconds,
        acceptance=acceptance,
        num_speculative=4,
        acceptance_prompts=len(acceptance_questions),
        samples=samples,
    )
    write_card(args.out / "README.md", results)
    accepted, proposed = acceptance
    print(
        f"done in {sum(seconds.values()) / 60:.1f} min: ppl target {target_info['ppl']:.2f}, "
        f"draft {draft_info['ppl']:.2f}, acceptance {accepted / max(1, proposed):.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
