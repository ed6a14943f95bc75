"""`self_check`: what a loaded engine really runs on, and one short reply through it, for a server's start-up.

Why: a person reading the playground's figures must know which hardware and which paths produced them (a GPU Space
may come up on another card, in another precision, with CUDA graphs off). The check reads what the engine resolved
(device, dtype, attention, CUDA graphs and why they are off) and times one greedy reply of a few tokens, so a broken
device fails here with its message instead of on the first visitor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.plan import cuda_graphs_off
from engine.sampling_params import SamplingParams

CHECK_PROMPT = "Hello"
CHECK_TOKENS = 16


@dataclass(frozen=True)
class SelfCheck:
    """What the engine runs on, and its check reply: tokens and wall time (or the error that ended it)."""

    device_name: str
    backend: str
    dtype: str
    attention: str
    cuda_graphs: str  # "on", or "off: why"
    reply_tokens: int
    reply_ms: float
    error: str | None = None

    def line(self) -> str:
        """One line for a header."""
        reply = (f"check reply failed: {self.error}" if self.error else
                 f"a {self.reply_tokens}-token check reply in {self.reply_ms:.0f} ms")
        return (f"checked at start-up: {self.device_name} · {self.backend} · {self.dtype} · attention "
                f"{self.attention} · CUDA graphs {self.cuda_graphs} · {reply}")


def self_check(engine, tokens: int = CHECK_TOKENS) -> SelfCheck:
    """Check `engine` (loaded): its resolved paths and one greedy reply of `tokens` tokens, timed end to end."""
    info = engine.info
    if info.backend == "native":
        graphs = "on" if info.cuda_graphs else cuda_graphs_off(engine.config, info.device, info.attention)
    else:
        graphs = f"off: the {info.backend} backend does not capture them"
    started = time.perf_counter()
    output = engine.generate([CHECK_PROMPT], SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))[0]
    elapsed_ms = (time.perf_counter() - started) * 1000
    return SelfCheck(info.device_name, info.backend, info.dtype, info.attention, graphs, output.metrics.output_tokens,
                     elapsed_ms, output.error if output.finish_reason == "error" else None)
