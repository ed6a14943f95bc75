"""Running a comparison: two configurations (and optionally the transformers baseline) on the same prompts,
with the same seed and sampling, measured one after the other; and the arithmetic of its rounds.

Why a module: a comparison has its own rules. Each side is timed alone (the job holds one engine at a
time and runs a side's prompts to the end before the next side starts); repeats alternate the order
(A, B, then B, A) so that a warm cache or a load spike does not favour one side; the table gives each
figure's median over the repeats, its spread, and the ratio of the medians to A. Both sides are
leased from the shared engine pool, so the memory budget applies as it does for chat. The figures are
the bench's own (`engine.measure_engine`), under its key names.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator

from engine import BenchRequest, RequestOutput, surge_requests
from playground.compare.request import CompareRequest
from playground.figures.configuration import config_summary
from playground.figures.run_charts import Timeline
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import fit_prompt
from playground.shared.errors import Refused
from playground.shared.measurement import MeasuredRun, MeasurementJob
from playground.shared.session import Session

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
    ("guided_mask_ms", "guided mask per token (ms)", "lower"),
    ("guided_mask_share", "guided mask, share of TPOT", "lower"),
)
# With a surge: the prompts' replies (the chat users) during the surge and outside it, and the surge's own
# first tokens (the bench's class figures, engine/tools/surge.py).
SURGE_FIGURES = (
    ("chat_p99_itl_during_surge_ms", "prompts' p99 token gap during the surge (ms)", "lower"),
    ("chat_p99_itl_outside_surge_ms", "prompts' p99 token gap outside it (ms)", "lower"),
    ("chat_p99_ttft_ms", "prompts' p99 TTFT (ms)", "lower"),
    ("surge_p99_ttft_ms", "surge p99 TTFT (ms)", "lower"),
    ("surge_completed", "surge requests completed", None),
)
FIGURE_KEYS = tuple(key for key, _, _ in FIGURES + SURGE_FIGURES)
# the sampling settings a comparison reports (both sides used them)
REPORTED_SAMPLING = ("temperature", "top_p", "top_k", "seed", "ignore_eos", "max_tokens")


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


def guided_figures(outputs: list[RequestOutput | None]) -> dict:
    """A structured run's measured mask work per output token (ms, over its finished requests) and its share of
    their mean TPOT (the chat's reply chips, for a whole run)."""
    finished = [o for o in outputs if o is not None and o.finish_reason != "cancelled"]
    tokens = sum(o.metrics.output_tokens for o in finished)
    per_token = sum(o.metrics.guided_mask_s for o in finished) / tokens if tokens else None
    tpots = [o.metrics.tpot for o in finished if o.metrics.tpot]
    share = per_token / statistics.mean(tpots) if per_token is not None and tpots else None
    return {"guided_mask_ms": None if per_token is None else 1000 * per_token, "guided_mask_share": share}


def token_differences(base: list[str], other: list[str]) -> dict:
    """Where two outputs (as token texts) part: identical, or the first token index that differs."""
    for index, (a, b) in enumerate(zip(base, other, strict=False)):
        if a != b:
            return {"identical": False, "first_difference": index}
    same = len(base) == len(other)
    return {"identical": same, "first_difference": None if same else min(len(base), len(other))}


class Comparisons:
    """Runs comparisons on the context's pool, under its limits."""

    def __init__(self, context: PlaygroundContext):
        self.context = context

    # ----- running -------------------------------------------------------------------------------

    def _requests_for(self, request: CompareRequest):
        """The prompts as token ids for one engine (its chat template, if it has one), checked against its context,
        the server's prompt cap, and the token cap of a whole comparison."""
        settings = self.context.settings

        def build(engine) -> list[BenchRequest]:
            tokenizer = engine.tokenizer
            if tokenizer is None:
                raise Refused("this model has no tokenizer, so it cannot answer text prompts")
            max_model_len = engine.info.max_model_len
            has_template = bool(getattr(tokenizer, "chat_template", None))
            ids = [fit_prompt(engine.encode, has_template, "", [], prompt, max_model_len, request.sampling.max_tokens,
                              settings.max_prompt_tokens).token_ids for prompt in request.prompts]
            chat = [BenchRequest(i, request.sampling.max_tokens, 0.0) for i in ids]
            surge = self._surge(request, engine, len(chat))
            tokens = request.repeats * len(request.sides) * sum(len(r.prompt) + r.max_tokens for r in chat + surge)
            if tokens > settings.max_bench_tokens:
                raise Refused(f"this comparison would process about {tokens:,} tokens, over this server's cap of "
                              f"{settings.max_bench_tokens:,} (PLAYGROUND_MAX_BENCH_TOKENS): fewer prompts, repeats "
                              "or max_tokens")
            return chat + surge

        return build

    @staticmethod
    def _surge(request: CompareRequest, engine, num_chat: int) -> list[BenchRequest]:
        """The surge's random prompts for this engine's vocabulary (the same on every side: one seed), each held
        until the prompts' replies have streamed half their tokens in all (as the bench's `--surge`)."""
        surge = request.surge
        if surge is None:
            return []
        if surge.input_len + surge.output_len > engine.info.max_model_len:
            raise Refused(f"a surge prompt of {surge.input_len} tokens asking {surge.output_len} does not fit this "
                          f"model's context of {engine.info.max_model_len} tokens")
        return surge_requests(random.Random(request.sampling.seed), surge, engine.info.vocab_size,
                              surge.after_tokens * num_chat)

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
                    run = job.measure(self.context.pool, side.label, side.config, build,
                                      side.sampling(request.sampling), perplexity=request.perplexity and number == 0,
                                      pieces=number == 0)
                    if side.guided is not None:
                        run.result.update(guided_figures(run.outputs))
                    runs[side.label] = run
                if runs:
                    rounds.append(runs)
                if job.cancel.is_set():
                    break
            if request.perplexity and not job.cancel.is_set():  # each model's float32 reference, once per app
                for side in request.sides:
                    self.context.references.measure(side.config)
            return rounds

        return work

    def run(self, request: CompareRequest, session: Session) -> Iterator[MeasurementJob]:
        """Queue the comparison for the measurement slot and yield its job every POLL_S until it ends (waiting its turn,
        then running; closing this generator cancels it)."""
        place = self.context.measurements.take(session)  # refused while this session measures or waits already
        session.compare.job = MeasurementJob(self._work(request), self.context.measurements, place)
        yield from session.compare.job.follow(POLL_S)

    def outcome(self, request: CompareRequest, job: MeasurementJob) -> dict:
        """The finished comparison as plain data (what `/compare` returns and the tab renders)."""
        if job.error is not None:
            raise Refused(self.context.describe(job.error))
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
            shown = run.outputs[:len(request.prompts)]  # the prompts' replies, not the surge's
            outcome["sides"][side.label].update({
                "config": run.result["config"], "summary": config_summary(run.config, run.info),
                "guided": side.guided.kind if side.guided is not None else None,
                "perplexity_reference": getattr(self.context.references.cached(run.config.model), "perplexity",
                                                None),
                "outputs": [o.text if o else "" for o in shown],
                "finish_reasons": [o.finish_reason if o else "cancelled" for o in shown],
                "output_tokens": [len(o.token_ids) if o else 0 for o in shown],
                "pieces": run.pieces,
            })
        outcome["differences"] = [
            {label: token_differences(first["A"].pieces[index], first[label].pieces[index]) for label in labels[1:]}
            for index in range(len(request.prompts))]
        surge = request.surge
        outcome.update({"labels": labels, "prompts": list(request.prompts), "rounds": len(rounds),
                        "surge": {"count": surge.count, "input_len": surge.input_len, "output_len": surge.output_len,
                                  "after_tokens": surge.after_tokens} if surge else None,
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
