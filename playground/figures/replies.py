"""The figures of each reply, computed from the engine's metrics and formatted one way (chips, one line).

Definitions follow docs/metrics.md: the engine's TTFT runs from the request's arrival in the engine to
its first output token; decode throughput is (output tokens - 1) / (E2EL - TTFT), i.e. 1 / TPOT;
speculative acceptance = accepted / proposed; guided decoding's mask per token = the reply's measured mask work
(`guided_mask_s`: computing and applying the grammar's token mask) / output tokens, and its share of TPOT = that
/ TPOT (what the grammar adds to each token's time). Two more waits are measured around the engine,
because a person waits longer than the engine's TTFT: `first_text_ms` runs from the server
receiving the message to its first text leaving the server (history fitting, tokenisation and
queueing included), and `visible_ttft_ms` from the browser's Enter to the first text on screen
(measured by the page; absent for API calls). Labels always say which one a number is.
"""

from __future__ import annotations

import html

from engine import RequestMetrics
from playground.figures.spread import Spread

FIGURE_TITLES = {
    "engine TTFT": "time to first token inside the engine: from the request's arrival in the engine to its first "
                   "output token",
    "client TTFT": "time to first token seen by this client of a served model (backend=remote): from sending the "
                   "request to its first streamed text (the network and the server's queue included)",
    "Enter → text": "what you waited: from pressing Enter to the first text on screen (network, queue, "
                    "tokenisation and the engine's TTFT)",
    "decode": "output tokens per second after the first one (1 / TPOT)",
    "prompt": "prompt tokens of this reply, and how many came from the prefix cache",
    "output": "tokens generated",
    "spec accept": "speculative tokens accepted / proposed for this reply, and the tokens it gained per verification "
                   "step (1 + accepted proposals per step; 1 = speculation gained nothing)",
    "guided mask": "structured output's cost: the engine's measured time computing and applying the grammar's token "
                   "mask, per output token, and its share of the reply's TPOT",
    "grammar compile": "time the engine took to compile this reply's schema or regex into a grammar (0 when it came "
                       "from the cache; not part of TPOT)",
    "context": "older turns left out so the prompt fits the model's context and the reply's token budget",
    "ZeroGPU call": "ZeroGPU mode: this reply's GPU call: its wall time, the duration it asked for, and the part spent "
                    "rebuilding the engine, which every call pays (see the glossary)",
}


def decode_tokens_per_second(metrics: RequestMetrics) -> float | None:
    """Tokens per second after the first one, None until two tokens are out."""
    ttft, e2el = metrics.ttft, metrics.e2el
    if metrics.output_tokens < 2 or ttft is None or e2el is None or e2el <= ttft:
        return None
    return (metrics.output_tokens - 1) / (e2el - ttft)


def guided_mask_per_token(metrics: RequestMetrics) -> float | None:
    """Seconds of measured mask work per output token, None before the first token."""
    return metrics.guided_mask_s / metrics.output_tokens if metrics.output_tokens else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def reply_figures(metrics: RequestMetrics | None, speculative: bool, guided: bool = False,
                  served_elsewhere: bool = False) -> dict:
    """Per-reply figures from the engine's metrics, as plain numbers (also what the APIs return); a reply
    that got no token yet (`metrics` None) has empty figures. `guided`: the reply was sent with structured output
    (its mask figures are added). `served_elsewhere`: a served model's reply (backend=remote), whose times are
    this client's (`measured_at` says so, and the chips are labelled so)."""
    if metrics is None:
        metrics = RequestMetrics()
    figures = {
        "engine_ttft_ms": _ms(metrics.ttft),
        "decode_tokens_per_s": _round(decode_tokens_per_second(metrics), 1),
        "tpot_ms": _ms(metrics.tpot),
        "e2el_ms": _ms(metrics.e2el),
        "prompt_tokens": metrics.prompt_tokens,
        "cached_tokens": metrics.cached_tokens,
        "output_tokens": metrics.output_tokens,
    }
    if served_elsewhere:
        figures["measured_at"] = "client"
    if speculative:
        proposed, accepted, drafts = metrics.spec_proposed, metrics.spec_accepted, metrics.spec_drafts
        figures["spec_acceptance"] = round(accepted / proposed, 3) if proposed else None
        figures["spec_accepted"], figures["spec_proposed"] = accepted, proposed
        figures["spec_tokens_per_step"] = round(1 + accepted / drafts, 2) if drafts else None
    if guided:
        per_token = guided_mask_per_token(metrics)
        figures["guided_mask_ms"] = None if per_token is None else round(per_token * 1000, 3)
        figures["guided_mask_share"] = round(per_token / metrics.tpot, 4) if per_token is not None and metrics.tpot \
            else None
        figures["guided_compile_ms"] = round(metrics.guided_compile_s * 1000, 1)
    return figures


def figures_html(figures: dict, finish_reason: str | None = None, dropped_turns: int = 0, live: bool = False,
                 spreads: dict[str, Spread] | None = None) -> str:
    """A row of small labelled chips placed under a reply (hover a chip for its definition); `spreads` puts the
    configuration's running median and range beside the reply's TTFT and decode speed."""
    spreads = spreads or {}

    def with_spread(key: str, number: str, unit: str) -> str:
        own = _fmt(figures.get(key), f"{number} {unit}")
        return f"{own} ({spreads[key].text(number, unit)})" if key in spreads else own

    ttft_label = "client TTFT" if figures.get("measured_at") == "client" else "engine TTFT"
    chips = [(ttft_label, with_spread("engine_ttft_ms", "{:.0f}", "ms"))]
    if figures.get("visible_ttft_ms") is not None:
        chips.append(("Enter → text", _fmt(figures["visible_ttft_ms"], "{:.0f} ms")))
    chips += [
        ("decode", with_spread("decode_tokens_per_s", "{:.1f}", "tok/s")),
        ("prompt", f"{figures.get('prompt_tokens') or 0} tok · {figures.get('cached_tokens') or 0} cached"),
        ("output", f"{figures.get('output_tokens') or 0} tok"),
    ]
    if "spec_acceptance" in figures:
        chips.append(("spec accept", spec_acceptance_text(figures)))
    if "guided_mask_ms" in figures:
        chips.append(("guided mask", guided_mask_text(figures)))
        if figures.get("guided_compile_ms"):
            chips.append(("grammar compile", _fmt(figures["guided_compile_ms"], "{:.0f} ms")))
    if "zerogpu_call_s" in figures:
        chips.append(("ZeroGPU call", f"{figures['zerogpu_call_s']:.1f} of {figures['zerogpu_asked_s']:.0f} s asked · "
                                      f"rebuild {figures['zerogpu_rebuild_s']:.1f} s"))
    if dropped_turns:
        chips.append(("context", f"{dropped_turns} older turn{'s' if dropped_turns > 1 else ''} left out"))
    if finish_reason in ("length", "cancelled", "error"):
        chips.append(("finish", {"length": "token limit", "cancelled": "stopped"}.get(finish_reason, "error")))
    body = "".join(f'<span class="fig" title="{html.escape(FIGURE_TITLES.get(k, k))}">'
                   f'<span class="fig-k">{html.escape(k)}</span> <span class="fig-v">{html.escape(v)}</span></span>'
                   for k, v in chips)
    return f'<div class="msg-figures{" live" if live else ""}">{body}</div>'


def spec_acceptance_text(figures: dict) -> str:
    """A reply's acceptance: rate, accepted / proposed, tokens per verification step ("n/a" before any)."""
    if figures.get("spec_acceptance") is None:
        return "n/a"
    text = f"{figures['spec_acceptance']:.0%}"
    if figures.get("spec_proposed"):
        text += f" ({figures['spec_accepted']}/{figures['spec_proposed']})"
    if figures.get("spec_tokens_per_step") is not None:
        text += f" · {figures['spec_tokens_per_step']:.2f} tok/step"
    return text


def guided_mask_text(figures: dict) -> str:
    """A reply's mask work per output token and its share of TPOT ("n/a" before any token)."""
    text = _fmt(figures.get("guided_mask_ms"), "{:.3f} ms/tok")
    if figures.get("guided_mask_share") is not None:
        text += f" · {figures['guided_mask_share']:.1%} of TPOT"
    return text


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else spec.format(value)
