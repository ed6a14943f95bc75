"""Running benchmarks on a session's active configuration, measured exactly as `python -m engine.bench` measures
them, and keeping the session's runs to overlay and export.

Why a module: the workload is the bench's (`engine.build_workload`) and so is the measurement
(`engine.measure_engine`), so a figure here and on the command line mean the same; what this adds is
what a shared server needs around them: every request checked against the engine's context and the
caps, a background job the page can follow and cancel, and a session's history of runs (the newest
MAX_KEPT_RUNS) with their exports.
"""

from __future__ import annotations

import json
import math
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from engine import BenchRequest, EngineError, SamplingParams, bench_report, build_workload, resolve_dataset
from playground.benchmark.exports import runs_csv
from playground.benchmark.workload import BenchmarkRequest
from playground.figures.configuration import config_summary, config_tag
from playground.figures.run_charts import PALETTE, Timeline
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.measurement import MeasurementJob
from playground.shared.run_state import MAX_KEPT_RUNS, BenchmarkRecord
from playground.shared.session import Session

POLL_S = 0.5


def run_timeline(number: int, started: float, steps: list) -> Timeline:
    """Run `number` on the charts, in its own colour (the same whichever runs are shown with it)."""
    return Timeline(f"run {number}", started, steps, PALETTE[(number - 1) % len(PALETTE)])


class BenchmarkRuns:
    """A session's benchmark runs, on the context's pool and under its limits."""

    def __init__(self, context: PlaygroundContext):
        self.context = context
        self.settings = context.settings
        self._exports = tempfile.TemporaryDirectory(prefix="playground-bench-")

    # ----- running -------------------------------------------------------------------------------

    def _requests_for(self, request: BenchmarkRequest):
        """The workload for one engine: built by `engine.build_workload`, text prompts encoded by the engine,
        each checked against its context and the server's caps."""
        settings = self.settings

        def build(engine) -> list[BenchRequest]:
            max_model_len = engine.info.max_model_len
            try:
                spec = replace(request.spec, dataset=resolve_dataset(request.spec.dataset, engine.config.model))
                workload = build_workload(spec, engine.info.vocab_size)
                encoded = [replace(r, prompt=engine.encode(r.prompt)) for r in workload]
            except EngineError as error:
                raise Refused(self.context.describe(error)) from None
            total = 0
            for number, item in enumerate(encoded, start=1):
                length = len(item.prompt)
                if length > settings.max_prompt_tokens or length + item.max_tokens > max_model_len:
                    raise Refused(f"request {number}: a prompt of {length} tokens + {item.max_tokens} output tokens "
                                  f"does not fit (context {max_model_len}, prompt cap {settings.max_prompt_tokens})")
                total += length + item.max_tokens
            if total > settings.max_bench_tokens:
                raise Refused(f"this run has {total:,} tokens, over this server's cap of "
                              f"{settings.max_bench_tokens:,} (PLAYGROUND_MAX_BENCH_TOKENS)")
            return encoded

        return build

    def run(self, request: BenchmarkRequest, session: Session) -> Iterator[MeasurementJob]:
        """Queue the run on the session's active configuration for the measurement slot; yield its job every POLL_S
        until it ends (waiting its turn, then running).

        Closing this generator (the page or the API client went away) cancels the run and waits for its requests to
        end.
        """
        state = session.benchmark
        place = self.context.measurements.take(session)  # refused while this session measures or waits already
        config = session.config
        sampling = SamplingParams(seed=request.spec.seed, ignore_eos=request.ignore_eos)

        def work(job: MeasurementJob):
            return job.measure(self.context.pool, "this run", config, self._requests_for(request), sampling,
                               spec=request.spec, concurrency=request.concurrency, warmup=True,
                               goodput_slos=request.goodput_slos)

        state.job = MeasurementJob(work, self.context.measurements, place)
        yield from state.job.follow(POLL_S)

    def record(self, request: BenchmarkRequest, job: MeasurementJob, session: Session) -> BenchmarkRecord:
        """The finished run as a report with `engine.bench --json`'s keys, kept in the session's history."""
        if job.error is not None:
            raise Refused(self.context.describe(job.error))
        run, state = job.result, session.benchmark
        report = bench_report(run.result, request.spec, request.concurrency, 0.0, request.ignore_eos, None,
                              request.goodput_slos)
        report["config_label"] = config_tag(run.config)  # the exports name the configuration as the page does
        if self.settings.public:  # an uploaded file's server path is not the visitor's business
            report["workload"]["dataset"] = Path(report["workload"]["dataset"]).name
        spec = request.spec
        dataset = "random" if spec.dataset == "random" else ("chat" if spec.dataset == "chat" else "upload")
        label = (f"{config_tag(run.config)} · {dataset} ×{spec.num_prompts} · concurrency "
                 f"{request.concurrency}" + ("" if math.isinf(spec.request_rate) else f" · {spec.request_rate:g}/s")
                 + (" · cancelled" if run.result["cancelled_requests"] else ""))
        record = BenchmarkRecord(number=state.next_number, label=label, summary=config_summary(run.config, run.info),
                                 report=report, started=run.started, steps=run.steps)
        state.next_number += 1
        state.runs = (state.runs + [record])[-MAX_KEPT_RUNS:]
        return record

    def cancel(self, session) -> str:
        """Cancel: nothing more is sent, requests in flight are cancelled; the run ends with what finished."""
        job = session.benchmark.job if isinstance(session, Session) else None
        if job is None or job.done.is_set():
            return "no benchmark is running"
        job.cancel.set()
        return "cancelling"

    # ----- views -------------------------------------------------------------------------------

    @staticmethod
    def selected_runs(selected, session: Session) -> list[BenchmarkRecord]:
        numbers = {n for n in selected or [] if isinstance(n, int) and not isinstance(n, bool)}
        return [run for run in session.benchmark.runs if run.number in numbers]

    @staticmethod
    def timelines(runs: list[BenchmarkRecord]) -> list[Timeline]:
        return [run_timeline(run.number, run.started, run.steps) for run in runs]

    def export_files(self, session: Session, record: BenchmarkRecord) -> tuple[str, str]:
        """(JSON of `record`, CSV of every kept run), written to fresh files for the download buttons."""
        state = session.benchmark
        for old in state.export_paths:
            Path(old).unlink(missing_ok=True)
        folder = Path(self._exports.name) / uuid.uuid4().hex
        folder.mkdir()
        as_json, as_csv = folder / f"benchmark-{record.number}.json", folder / "benchmark-runs.csv"
        as_json.write_text(json.dumps(record.report, indent=2, default=str), encoding="utf-8")
        as_csv.write_text(runs_csv([run.report for run in state.runs]), encoding="utf-8")
        state.export_paths = [str(as_json), str(as_csv)]
        return str(as_json), str(as_csv)
