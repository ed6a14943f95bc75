"""A comparison as asked for: each side's configuration (the engine panel or a preset, then its changes), the
optional transformers baseline, the prompts and the sampling both sides share, and an optional surge of long prompts
sent into the replies (the workload prefill/decode disaggregation is for), parsed and validated.

Why a module: the tab's controls, the live line under each side and `/compare` all read a comparison the
same way, and refuse a bad one with one clear message before anything runs. What "engine panel" means
is given: the panel's values on the page (read by the engine panel's own parser, which the composition
root hands over), the session's active configuration for API clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from engine import EngineConfig, EngineError, GuidedDecoding, SamplingParams, SurgeSpec, parse_sets
from playground.shared.configs import default_config, preset_config
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.structured_output import parse_structured_output
from playground.shared.surge import parse_surge
from playground.shared.values import parse_int

PANEL = "engine panel"
BASELINE = "baseline"
# The baselines a comparison can add beside A: the engines people measure against (A's model with every other field
# at its default), by name; `/compare` also takes true (transformers) and false (none).
NO_BASELINE = "none"
BASELINES = {"transformers": {"backend": "hf"}, "llama.cpp f32": {"backend": "llama.cpp", "gguf_type": "f32"},
             "llama.cpp q8_0": {"backend": "llama.cpp", "gguf_type": "q8_0"},
             "llama.cpp q4_0": {"backend": "llama.cpp", "gguf_type": "q4_0"}}
MAX_COMPARE_PROMPTS = 8
MAX_COMPARE_REPEATS = 5
MAX_CHANGES_CHARS = 2000
# which sides get the structured output: B alone (A answers the same without the grammar, beside it), or A and B
# (two configurations under the same grammar); the baseline follows A
STRUCTURED_SIDES = ("B", "A and B")


@dataclass(frozen=True)
class Side:
    """One column of the comparison: its label, its validated configuration and its structured output (if any)."""

    label: str
    config: EngineConfig
    guided: GuidedDecoding | None = None

    def sampling(self, shared: SamplingParams) -> SamplingParams:
        """What this side's requests sample with: the shared settings, with its own structured output."""
        return replace(shared, guided=self.guided)


@dataclass(frozen=True)
class CompareRequest:
    """A comparison as asked for, parsed and validated."""

    sides: tuple[Side, ...]
    prompts: tuple[str, ...]
    sampling: SamplingParams  # max_tokens and every sampling setting, seed always set (each side adds its guided)
    repeats: int
    perplexity: bool
    surge: SurgeSpec | None = None  # long prompts sent once the prompts' replies are half streamed


def parse_changes(text) -> dict:
    """KEY=VALUE changes to a configuration, one per line or comma (the bench's --set syntax)."""
    if text is None:
        return {}
    if not isinstance(text, str):
        raise Refused("the changes must be text, one KEY=VALUE per line")
    if len(text) > MAX_CHANGES_CHARS:
        raise Refused(f"the changes are longer than {MAX_CHANGES_CHARS} characters")
    items = [item.strip() for line in text.splitlines() for item in line.split(",") if item.strip()]
    try:
        return parse_sets(items)
    except EngineError as error:
        raise Refused(str(error)) from None


def parse_baseline(value) -> str | None:
    """The baseline asked for: a `BASELINES` name, true (transformers), or none (false, "none")."""
    if value is True or value is False:
        return "transformers" if value else None
    if value == NO_BASELINE:
        return None
    if not isinstance(value, str) or value not in BASELINES:
        raise Refused(f"baseline must be one of {NO_BASELINE}, {', '.join(BASELINES)} (or true / false), got "
                      f"{str(value)[:40]!r}")
    return value


def parse_prompts(text, max_chars: int) -> tuple[str, ...]:
    if not isinstance(text, str):
        raise Refused("the prompts must be text, one prompt per line")
    prompts = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not prompts:
        raise Refused("give at least one prompt (one per line)")
    if len(prompts) > MAX_COMPARE_PROMPTS:
        raise Refused(f"at most {MAX_COMPARE_PROMPTS} prompts per comparison, got {len(prompts)}")
    if any(len(prompt) > max_chars for prompt in prompts):
        raise Refused(f"a prompt may be at most {max_chars:,} characters (PLAYGROUND_MAX_MESSAGE_CHARS)")
    return prompts


class ComparisonParser:
    """Reads a comparison under the context's limits; `read_panel` turns the engine panel's values (and its
    extra preset fields) into configuration fields."""

    def __init__(self, context: PlaygroundContext, read_panel: Callable[[Sequence, object], dict]):
        self.context = context
        self.read_panel = read_panel

    def panel(self, form, extras) -> dict:
        """The engine panel's configuration fields, from its values on the page."""
        return self.read_panel(form, extras)

    def side_config(self, source, changes, panel: dict) -> EngineConfig:
        """A side's configuration: the panel or a preset (with the panel's model), then its changes; validated
        (Refused says why not)."""
        base = panel if source == PANEL else preset_config(source, panel["model"], self.context.presets)
        return self._validated({**base, **parse_changes(changes)})

    def baseline_config(self, config: EngineConfig, baseline: str = "transformers") -> EngineConfig:
        """A `BASELINES` engine serving the same model, every other field at its default: plain transformers in the
        same precision, or llama.cpp on the CPU with one of its GGUF types."""
        fields = {**default_config(config.model), **BASELINES[baseline]}
        if baseline == "transformers":
            fields.update(device=config.device, dtype=config.dtype)
        return self._validated(fields)

    def _validated(self, fields: dict) -> EngineConfig:
        try:
            return self.context.validate(fields)
        except EngineError as error:
            raise Refused(self.context.describe(error)) from None

    def sides(self, a_source, a_changes, b_source, b_changes, baseline, panel: dict, structured=None,
              structured_spec="", structured_sides="B") -> tuple[Side, ...]:
        """The sides asked for, B (or A and B) with the structured output asked for; the baseline, which has no
        grammar, goes with an A that has none."""
        baseline = parse_baseline(baseline)
        if structured_sides not in STRUCTURED_SIDES:
            raise Refused(f"structured output goes to {' or '.join(STRUCTURED_SIDES)}, not "
                          f"{str(structured_sides)[:40]!r}")
        guided = parse_structured_output(structured, structured_spec, self.context.settings.max_message_chars)
        a_guided = guided if structured_sides == "A and B" else None
        if baseline and a_guided is not None:
            raise Refused(f"the {baseline} baseline cannot decode under a grammar: send structured output to B "
                          "alone, or leave the baseline out")
        a = Side("A", self.side_config(a_source, a_changes, panel), a_guided)
        sides = [a, Side("B", self.side_config(b_source, b_changes, panel), guided)]
        if baseline:
            sides.append(Side(BASELINE, self.baseline_config(a.config, baseline), a_guided))
        return tuple(sides)

    def parse(self, a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature, top_p, top_k, seed,
              repeats, baseline, perplexity, structured, structured_spec, structured_sides, surge,
              panel: dict) -> CompareRequest:
        """The comparison asked for, or Refused naming the first bad value. `panel` is what "engine panel" means:
        the panel's values on the page, the session's active configuration for API clients."""
        settings = self.context.settings
        sides = self.sides(a_source, a_changes, b_source, b_changes, baseline, panel, structured, structured_spec,
                           structured_sides)
        params = parse_sampling(settings, max_tokens, temperature, top_p, top_k, seed)
        if not isinstance(perplexity, bool):
            raise Refused("perplexity must be true or false")
        return CompareRequest(sides=sides, prompts=parse_prompts(prompts, settings.max_message_chars),
                              sampling=replace(params, seed=params.seed or 0),
                              repeats=parse_int("repeats", repeats, 1, MAX_COMPARE_REPEATS), perplexity=perplexity,
                              surge=parse_surge(settings, surge, params.max_tokens))
