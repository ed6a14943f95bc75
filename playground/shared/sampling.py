"""Sampling controls (UI, Gradio API, OpenAI API) -> `SamplingParams`, under the hosting caps.

Why one parser: the chat box, `/chat` and `/v1/*/completions` accept the same knobs from anyone;
each value is checked here once (finite numbers, integer seeds inside 64 bits, a few short stop
strings, no more new tokens than the server allows) and refused with one clear message.
"""

from __future__ import annotations

from engine import SamplingParams
from playground.shared.errors import Refused
from playground.shared.settings import MAX_SEED, MAX_STOP_CHARS, MAX_STOP_STRINGS, Settings
from playground.shared.values import parse_int, parse_real

MAX_TEMPERATURE = 2.0
# Below this a temperature only divides logits by a tiny number (overflow, no useful randomness):
# it is served greedily, as temperature 0.
GREEDY_BELOW = 1e-3


def parse_stop(stop) -> tuple[str, ...]:
    """Stop strings: None, one string or a list of them; at most MAX_STOP_STRINGS of MAX_STOP_CHARS each."""
    if stop is None or stop == "":
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list | tuple) or not all(isinstance(s, str) for s in items):
        raise Refused("stop must be a string or a list of strings", "stop")
    items = [s for s in items if s]
    if len(items) > MAX_STOP_STRINGS:
        raise Refused(f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in items):
        raise Refused(f"a stop string may be at most {MAX_STOP_CHARS} characters", "stop")
    if not all(_encodable(s) for s in items):
        raise Refused("a stop string is not valid Unicode text (it contains a lone surrogate)", "stop")
    return tuple(items)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_seed(seed) -> int | None:
    """None (or empty) for a random seed, else an integer in [0, 2**63 - 1]."""
    if seed is None or (isinstance(seed, str) and not seed.strip()):
        return None
    return parse_int("seed", seed, 0, MAX_SEED)


def parse_sampling(settings: Settings, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None, stop=None,
                   ignore_eos: bool = False) -> SamplingParams:
    """Validated SamplingParams; `max_tokens` may not exceed PLAYGROUND_MAX_NEW_TOKENS."""
    cap = settings.max_new_tokens
    tokens = parse_int("max_tokens", max_tokens, 1)
    if tokens > cap:
        raise Refused(f"max_tokens={tokens} is over this server's maximum of {cap} (PLAYGROUND_MAX_NEW_TOKENS)",
                      "max_tokens")
    if not isinstance(ignore_eos, bool):
        raise Refused("ignore_eos must be true or false", "ignore_eos")
    temperature = parse_real("temperature", 0.0 if temperature is None else temperature, 0.0, MAX_TEMPERATURE)
    return SamplingParams(
        max_tokens=tokens,
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=parse_real("top_p", 1.0 if top_p is None else top_p, 0.0, 1.0, low_open=True),
        top_k=parse_int("top_k", 0 if top_k is None else top_k, 0, 1_000_000),
        seed=parse_seed(seed),
        stop=parse_stop(stop),
        ignore_eos=ignore_eos,
    ).validate()  # cannot fail: every value is already inside the engine's bounds
