"""Model shapes and the causal-LM training loop shared by the target and the draft.

The target is a plain Llama deep enough that a one- or two-layer draft costs a fraction of
it per token (on a CPU a tiny model's forward is mostly fixed per-layer overhead). Budgets
are step counts, not minutes, so a build learns the same thing on a busy machine as on an
idle one; only its duration changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

MAX_POSITIONS = 1024


@dataclass(frozen=True)
class ModelShape:
    """The few numbers that size a Llama; heads equal KV heads (plain multi-head attention)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int


TARGET_SHAPE = ModelShape(hidden=256, layers=8, heads=8, intermediate=704)
DRAFT_SHAPE = ModelShape(hidden=160, layers=2, heads=5, intermediate=384)


@dataclass
class TrainSettings:
    """Optimiser and schedule for a fixed number of steps."""

    steps: int
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 40
    weight_decay: float = 0.1
    seed: int = 0


@dataclass
class TrainReport:
    """What a run did: steps, tokens, wall and process CPU seconds, the loss of every step."""

    steps: int
    seconds: float
    cpu_seconds: float
    tokens: int
    losses: list[float] = field(default_factory=list)


def build_model(shape: ModelShape, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def token_stream(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], chats: list[list[dict]]
) -> torch.Tensor:
    """All documents and rendered chats, each led by the document token, in one 1-D tensor (empty for none)."""
    rendered = [tokenizer.apply_chat_template(chat, tokenize=False) for chat in chats]
    encoded = tokenizer(texts + rendered, add_special_tokens=False, verbose=False).input_ids if texts or chats else []
    ids = [token for doc in encoded for token in [tokenizer.bos_token_id, *doc]]
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Rows of `seq_len + 1` tokens (inputs plus the shifted targets), overlapping by one; no rows (an empty
    tensor of that width, which concatenates with others) when the stream is shorter than one row."""
    count = (len(stream) - 1) // seq_len
    if count < 1:
        return stream.new_empty((0, seq_len + 1))
    starts = torch.arange(count) * seq_len
    return torch.stack([stream[s: s + seq_len + 1] for s in starts.tolist()])


def replay_mix(focus: torch.Tensor, broad: torch.Tensor, replay_share: float, seed: int) -> torch.Tensor:
    """`focus` windows plus a random sample of `broad` ones making up `replay_share` of the result.

    A recall pass trains mostly on what must be recalled; the replayed broad windows keep the
    language model it already learned from drifting (its held-out perplexity).
    """
    count = round(len(focus) * replay_share / (1 - replay_share))
    generator = torch.Generator().manual_seed(seed)
    picked = torch.randperm(len(broad), generator=generator)[:count]
    return torch.cat([focus, broad[picked]])


def oversampled_mix(focus: torch.Tensor, broad: torch.Tensor, focus_share: float, seed: int) -> torch.Tensor:
    """Every `broad` window plus `focus` windows repeated until they make up `focus_share` of the result.

    One pass that sees the whole corpus while the entries people ask about most come round again
    and again: recall without a second pass that drifts the language model away from the rest
    (held-out perplexity). Whole copies of `focus` first, then a random sample for the remainder.
    """
    wanted = round(len(broad) * focus_share / (1 - focus_share))
    copies, remainder = divmod(wanted, len(focus))
    generator = torch.Generator().manual_seed(seed)
    sample = focus[torch.randperm(len(focus), generator=generator)[:remainder]]
    return torch.cat([broad, focus.repeat(copies, 1), sample])


def combined_report(*reports: TrainReport) -> TrainReport:
    """One report for consecutive runs on the same model."""
    return TrainReport(
        steps=sum(r.steps for r in reports), seconds=sum(r.seconds for r in reports),
        cpu_seconds=sum(r.cpu_seconds for r in reports), tokens=sum(r.tokens for r in reports),
        losses=[loss for r in reports for loss in r.losses],
    )


def next_token_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def learning_rate(step: int, total: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = min(1.0, (step - settings.warmup) / max(1, total - settings.warmup))
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: torch.nn.Module,
    data: torch.Tensor,
    settings: TrainSettings,
    loss_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = next_token_loss,
    log: Callable[[str], None] = print,
) -> TrainReport:
    """AdamW over shuffled passes of `data` windows for `settings.steps` steps."""
    generator = torch.Generator().manual_seed(settings.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=(0.9, 0.95),
    )
    model.train()
    order = torch.randperm(len(data), generator=generator)
    cursor = 0
    report = TrainReport(steps=0, seconds=0.0, cpu_seconds=0.0, tokens=0)
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(settings.steps):
        if cursor + settings.batch_size > len(order):
            order = torch.randperm(len(data), generator=generator)
            cursor = 0
        batch = data[order[cursor: cursor + settings.batch_size]]
        cursor += settings.batch_size
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings.steps, settings)
        loss = loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        report.losses.append(loss.item())
        report.tokens += batch[:, 1:].numel()
        done = step + 1
        if done % 100 == 0 or done == settings.steps:
            elapsed = time.perf_counter() - start
            mean_loss = sum(report.losses[-100:]) / len(report.losses[-100:])
            log(f"  step {done}/{settings.steps}  loss {mean_loss:.3f}  {elapsed / 60:.1f} min, "
                f"about {elapsed / done * (settings.steps - done) / 60:.0f} min left")
    report.steps = settings.steps
    report.seconds = time.perf_counter() - start
    report.cpu_seconds = time.process_time() - cpu_start
    model.eval()
    return report
