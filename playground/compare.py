"""The Compare tab's handlers: two configurations (and optionally the transformers baseline) on the same
prompts, with the same seed and sampling, measured one after the other; and "chat with both".

Why a module: a comparison has its own rules. Each side is timed alone (the job holds one engine at a
time and runs a side's prompts to the end before the next side starts); repeats alternate the order
(A, B, then B, A) so that a warm cache or a load spike does not favour one side; the table gives each
figure's median over the repeats, its spread, and the ratio of the medians to A. Both sides are
leased from the shared engine pool, so the memory budget applies as it does for chat. The figures are
the bench's own (`engine.measure_engine`), under its key names.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine import BenchRequest, EngineError, SamplingParams, parse_sets
from playground.conversation import Conversation, Exchange, fit_prompt
from playground.errors import Refused, describe_error
from playground.figures import config_summary, reply_figures
from playground.form import FORM_FIELDS, default_config, parse_form, parse_int, preset_config
from playground.measurement import MeasuredRun, MeasurementJob
from playground.params import parse_sampling
from playground.run_charts import Timeline
from playground.session import Session

if TYPE_CHECKING:
    from playground.handlers import Playground

PANEL = "engine panel"
BASELINE = "baseline"
MAX_COMPARE_PROMPTS = 8
MAX_COMPARE_REPEATS = 5
MAX_CHANGES_CHARS = 2000
POLL_S = 0.4
# The figures of the comparison table: bench key, label, which way is better.
FIGURES = (
    ("mean_ttft_ms", "TTFT, mean (ms)", "lower"),
    ("mean_tpot_ms", "TPOT, mean (ms)", "lower"),
    ("mean_e2el_ms", "E2EL, mean (ms)", "lower"),
    ("output_throughput", "output throughput (tok/s)", "higher"),
    ("weights_bytes", "weights", "lower"),
    ("kv_cache_bytes", "KV cache allocated", None),
    ("peak_memory_bytes", "peak memory (whole process)", None),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", "higher"),
    ("spec_acceptance_rate", "speculative acceptance", "higher"),
    ("perplexity", "perplexity (held-out text)", "lower"),
)
FIGURE_KEYS = tuple(key for key, _, _ in FIGURES)
# the sampling settings a comparison reports (both sides used them)
REPORTED_SAMPLING = ("temperature", "top_p", "top_k", "seed", "ignore_eos", "max_tokens")


@dataclass(frozen=True)
class Side:
    """One column of the comparison: its label and its validated configuration."""

    label: str
    config: dict


@dataclass(frozen=True)
class CompareRequest:
    """A comparison as asked for, parsed and validated."""

    sides: tuple[Side, ...]
    prompts: tuple[str, ...]
    sampling: SamplingParams  # max_tokens and every sampling setting, seed always set
    repeats: int
    perplexity: bool


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


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def summarize_rounds(rounds: list[dict[str, MeasuredRun]], labels: list[str]) -> dict:
    """Per side, each figure's median, spread and values over the rounds; per side after A, the ratio of its
    medians to A's, and each round's own ratio."""
    sides, ratios, round_ratios = {}, {}, {}
    for label in labels:
        per_round = {key: [_number(r[label].result.get(key)) for r in rounds if label in r] for key in FIGURE_KEYS}
        values = {key: [v for v in series if v is not None] for key, series in per_round.items()}
        sides[label] = {"figures": {key: _median(v) for key, v in values.items()},
                        "spread": {key: [min(v), max(v)] if v else None for key, v in values.items()},
                        "per_round": per_round}
    base = sides[labels[0]]
    for label in labels[1:]:
        ratios[label] = {key: _ratio(sides[label]["figures"][key], base["figures"][key]) for key in FIGURE_KEYS}
        round_ratios[label] = {key: [_ratio(_number(r[label].result.get(key)), _number(r[labels[0]].result.get(key)))
                                     for r in rounds if label in r and labels[0] in r] for key in FIGURE_KEYS}
    return {"sides": sides, "ratios": ratios, "round_ratios": round_ratios}


def token_differences(base: list[str], other: list[str]) -> dict:
    """Where two outputs (as token texts) part: identical, or the first token index that differs."""
    for index, (a, b) in enumerate(zip(base, other, strict=False)):
        if a != b:
            return {"identical": False, "first_difference": index}
    same = len(base) == len(other)
    return {"identical": same, "first_difference": None if same else min(len(base), len(other))}


class CompareHandlers:
    """Compare tab handlers bound to the playground (its pool, limits and presets)."""

    def __init__(self, app: Playground):
        self.app = app

    @property
    def settings(self):
        return self.app.settings

    # ----- parsing ---------------------------------------------------------------------------------

    def side_config(self, source, changes, panel: dict) -> dict:
        """A side's configuration: the panel or a preset (with the panel's model), then its changes; validated
        (Refused says why not)."""
        base = panel if source == PANEL else preset_config(source, panel["model"], self.app.presets)
        return self._validated({**base, **parse_changes(changes)})

    def baseline_config(self, config: dict) -> dict:
        """Plain transformers serving the same model in the same precision, every other field at its default."""
        return self._validated({**default_config(config["model"]), "backend": "hf", "device": config["device"],
                                "dtype": config["dtype"]})

    def _validated(self, config: dict) -> dict:
        try:
            return self.app.validate(config)
        except EngineError as error:
            raise Refused(describe_error(error, self.settings.public)) from None

    def panel_config(self, form, extras) -> dict:
        if not isinstance(form, list | tuple) or len(form) != len(FORM_FIELDS):
            raise Refused(f"expected {len(FORM_FIELDS)} panel values")
        return parse_form(dict(zip(FORM_FIELDS, form, strict=True)), extras if isinstance(extras, dict) else {})

    def sides(self, a_source, a_changes, b_source, b_changes, baseline, panel: dict) -> tuple[Side, ...]:
        if not isinstance(baseline, bool):
            raise Refused("baseline must be true or false")
        a = Side("A", self.side_config(a_source, a_changes, panel))
        sides = [a, Side("B", self.side_config(b_source, b_changes, panel))]
        if baseline:
            sides.append(Side(BASELINE, self.baseline_config(a.config)))
        return tuple(sides)

    def parse(self, a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature, top_p, top_k, seed,
              repeats, baseline, perplexity, panel: dict) -> CompareRequest:
        """The comparison asked for, or Refused naming the first bad value. `panel` is what "engine panel" means:
        the panel's values on the page, the session's active configuration for API clients."""
        sides = self.sides(a_source, a_changes, b_source, b_changes, baseline, panel)
        params = parse_sampling(self.settings, max_tokens, temperature, top_p, top_k, seed)
        if not isinstance(perplexity, bool):
            raise Refused("perplexity must be true or false")
        return CompareRequest(sides=sides, prompts=parse_prompts(prompts, self.settings.max_message_chars),
                              sampling=replace(params, seed=params.seed or 0),
                              repeats=parse_int("repeats", repeats, 1, MAX_COMPARE_REPEATS), perplexity=perplexity)

    # ----- running -------------------------------------------------------------------------------

    def _requests_for(self, request: CompareRequest):
        """The prompts as token ids for one engine (its chat template, if it has one), checked against its context,
        the server's prompt cap, and the token cap of a whole comparison."""
        settings = self.settings

        def build(engine) -> list[BenchRequest]:
            tokenizer = engine.tokenizer
            if tokenizer is None:
                raise Refused("this model has no tokenizer, so it cannot answer text prompts")
            max_model_len = engine.info.max_model_len
            has_template = bool(getattr(tokenizer, "chat_template", None))
            ids = [fit_prompt(engine.encode, has_template, "", [], prompt, max_model_len, request.sampling.max_tokens,
                              settings.max_prompt_tokens).token_ids for prompt in request.prompts]
            tokens = request.repeats * len(request.sides) * sum(len(i) + request.sampling.max_tokens for i in ids)
            if tokens > settings.max_bench_tokens:
                raise Refused(f"this comparison would process about {tokens:,} tokens, over this server's cap of "
                              f"{settings.max_bench_tokens:,} (PLAYGROUND_MAX_BENCH_TOKENS): fewer prompts, repeats "
                              "or max_tokens")
            return [BenchRequest(i, request.sampling.max_tokens, 0.0) for i in ids]

        return build

    def _work(self, request: CompareRequest):
        def work(job: MeasurementJob) -> list[dict[str, MeasuredRun]]:
            rounds: list[dict[str, MeasuredRun]] = []
            build = self._requests_for(request)
            for number in range(request.repeats):
                order = request.sides if number % 2 == 0 else tuple(reversed(request.sides))
                runs: dict[str, MeasuredRun] = {}
                for side in order:
                    if job.cancel.is_set():
                        break
                    runs[side.label] = job.measure(self.app.pool, side.label, side.config, build, request.sampling,
                                                   perplexity=request.perplexity and number == 0,
                                                   pieces=number == 0)
                if runs:
                    rounds.append(runs)
                if job.cancel.is_set():
                    break
            return rounds

        return work

    def run(self, request: CompareRequest, session: Session) -> Iterator[MeasurementJob]:
        """Start the comparison and yield its job every POLL_S until it ends (closing this generator cancels it)."""
        state = session.compare
        if state.job is not None and not state.job.done.is_set():
            raise Refused("a comparison is already running in this tab: wait for it or press Stop")
        state.job = MeasurementJob(self._work(request))
        yield from state.job.follow(POLL_S)

    def outcome(self, request: CompareRequest, job: MeasurementJob) -> dict:
        """The finished comparison as plain data (what `/compare` returns and the tab renders)."""
        if job.error is not None:
            raise Refused(describe_error(job.error, self.settings.public))
        rounds = job.result or []
        labels = [side.label for side in request.sides if rounds and side.label in rounds[0]]
        if not labels or "A" not in labels:
            return {"cancelled": True, "labels": [], "rounds": 0}
        outcome = summarize_rounds(rounds, labels)
        first = rounds[0]
        for side in request.sides:
            if side.label not in first:
                continue
            run = first[side.label]
            outcome["sides"][side.label].update({
                "config": run.config, "summary": config_summary(run.config, run.info),
                "outputs": [o.text if o else "" for o in run.outputs],
                "finish_reasons": [o.finish_reason if o else "cancelled" for o in run.outputs],
                "output_tokens": [len(o.token_ids) if o else 0 for o in run.outputs],
                "pieces": run.pieces,
            })
        outcome["differences"] = [
            {label: token_differences(first["A"].pieces[index], first[label].pieces[index]) for label in labels[1:]}
            for index in range(len(request.prompts))]
        outcome.update({"labels": labels, "prompts": list(request.prompts), "rounds": len(rounds),
                        "orders": [list(r) for r in rounds], "cancelled": job.cancel.is_set(),
                        # each run's measured window (first request sent, last one done), seconds since the job began
                        "windows": [{label: [run.started - job.started, run.started + run.elapsed - job.started]
                                     for label, run in r.items()} for r in rounds],
                        "sampling": {key: getattr(request.sampling, key) for key in REPORTED_SAMPLING}})
        return outcome

    @staticmethod
    def timelines(job: MeasurementJob) -> list[Timeline]:
        """The last round's run of each side, for the overlaid charts."""
        rounds = job.result or []
        latest: dict[str, MeasuredRun] = {}
        for runs in rounds:
            latest.update(runs)
        return [Timeline(label, run.started, run.steps) for label, run in latest.items()]

    def stop(self, session) -> None:
        """Stop: the comparison (or the chat with both) ends cleanly at once."""
        if isinstance(session, Session):
            session.compare.chat_stop = True
            if session.compare.job is not None:
                session.compare.job.cancel.set()

    # ----- chat with both ----------------------------------------------------------------------

    def chat_reply(self, label: str, config: dict, conversation: Conversation, exchange: Exchange, params,
                   session: Session) -> Iterator[None]:
        """Stream one side's reply to the newest exchange of its conversation (yielding as text arrives)."""
        speculative = config["speculative"] != "off"
        with self.app.pool.lease(config) as entry:
            engine = entry.engine
            fitted = self.app.chat.fit(engine, conversation, len(conversation.exchanges) - 1, params.max_tokens)
            exchange.dropped_turns = fitted.dropped_turns
            exchange.config = f"{label} · {config_summary(config, engine.info)}"
            stream = engine.stream(fitted.token_ids, params)
            last = 0.0
            try:
                for delta in stream:
                    exchange.reply += delta.text
                    exchange.figures = reply_figures(delta.metrics, speculative)
                    if delta.finished:
                        exchange.finish_reason, exchange.error = delta.finish_reason, delta.error
                    elif session.compare.chat_stop:
                        break
                    if time.perf_counter() - last > 0.05 or delta.finished:
                        last = time.perf_counter()
                        yield
            finally:
                stream.close()
                if exchange.finish_reason is None:
                    exchange.finish_reason = "cancelled"

    def chat_both(self, message: str, sides: tuple[Side, ...], params, session: Session) -> Iterator[None]:
        """Send `message` to every side, one side at a time (the first side alternates per message)."""
        state = session.compare
        for side in sides:
            state.chats.setdefault(side.label, Conversation())
        turn = len(state.chats[sides[0].label].exchanges)
        order = sides if turn % 2 == 0 else tuple(reversed(sides))
        state.chat_stop, state.chat_streaming = False, True
        try:
            for side in order:
                conversation = state.chats[side.label]
                exchange = Exchange(user=message)
                conversation.exchanges.append(exchange)
                if state.chat_stop:
                    exchange.finish_reason = "cancelled"
                    continue
                try:
                    yield from self.chat_reply(side.label, side.config, conversation, exchange, params, session)
                except Exception as error:  # refused, over budget, failed to load: the reply says why
                    exchange.finish_reason, exchange.error = "error", describe_error(error, self.settings.public)
                yield
        finally:
            state.chat_streaming = False
