"""A surge as asked for (`COUNT:INPUT:OUTPUT`): the second request class of a Benchmark or a Compare run.

Why shared: the Benchmark tab and the Compare tab both send chat users a surge of long prompts (the workload
prefill/decode disaggregation is for), parsed the same way and held to the same caps.
"""

from __future__ import annotations

from engine import SurgeSpec
from playground.shared.errors import Refused
from playground.shared.settings import Settings
from playground.shared.values import parse_int


def parse_surge(settings: Settings, value, chat_output_len: int) -> SurgeSpec | None:
    """COUNT:INPUT:OUTPUT (empty: no surge): that many random prompts of INPUT tokens asking OUTPUT tokens each,
    released once the other requests have streamed half their output tokens (the bench's `--surge` default)."""
    text = value.strip() if isinstance(value, str) else None
    if text is None:
        raise Refused("surge must be COUNT:INPUT:OUTPUT (e.g. 8:512:32), or empty for none")
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 3:
        raise Refused(f"surge must be COUNT:INPUT:OUTPUT (e.g. 8:512:32), or empty for none; got {text!r}")
    count = parse_int("surge count", parts[0], 1, settings.max_bench_requests)
    input_len = parse_int("surge input tokens", parts[1], 1, settings.max_prompt_tokens)
    output_len = parse_int("surge output tokens", parts[2], 1, settings.max_new_tokens)
    return SurgeSpec(count, input_len, output_len, after_tokens=chat_output_len // 2)
