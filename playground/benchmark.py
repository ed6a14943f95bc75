"""The Benchmark tab's handlers: a workload on the session's active configuration, measured exactly as
`python -m engine.bench` measures it, with progress, live charts, Cancel, exports and earlier runs.

Why a module: the workload knobs are the bench's (`engine.WorkloadSpec`, `engine.build_workload`) and the
measurement is the bench's (`engine.measure_engine`), so a figure here and on the command line mean the
same; what this module adds is what a shared server needs around them: strict parsing with the hosting
caps (PLAYGROUND_MAX_BENCH_*), a background job the page can follow and cancel, and a session's
history of runs to overlay and export (JSON with `engine.bench --json`'s keys, CSV one row per run).
"""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine import (
    BenchRequest,
    EngineError,
    SamplingParams,
    WorkloadSpec,
    bench_report,
    build_workload,
    resolve_dataset,
)
from playground.errors import Refused, describe_error
from playground.figures import config_summary, config_tag
from playground.form import parse_int
from playground.measurement import MeasurementJob
from playground.run_charts import PALETTE, Timeline
from playground.run_state import MAX_KEPT_RUNS, BenchmarkRecord
from playground.session import Session

if TYPE_CHECKING:
    from playground.handlers import Playground

DATASETS = ("random", "chat", "upload")
MAX_UPLOAD_BYTES = 1024 * 1024
MAX_RATE = 1000.0
POLL_S = 0.5


@dataclass(frozen=True)
class BenchmarkRequest:
    """A benchmark as asked for, parsed and within the hosting caps."""

    spec: WorkloadSpec
    concurrency: int
    ignore_eos: bool
    goodput_slos: dict


def parse_length(name: str, value, maximum: int) -> tuple[int, tuple[int, int] | None]:
    """A length written N or LO:HI (a length drawn per request): (N or HI, the range or None)."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else None
    if text is None:
        raise Refused(f"{name} must be a number of tokens, or LO:HI")
    low, sep, high = text.partition(":")
    if not sep:
        return parse_int(name, low, 1, maximum), None
    low_value, high_value = parse_int(name, low, 1, maximum), parse_int(name, high, 1, maximum)
    if low_value > high_value:
        raise Refused(f"{name}: LO:HI needs LO <= HI, got {text}")
    return high_value, (low_value, high_value)


def _objective(name: str, value) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise Refused(f"the {name} objective must be a number of ms (0 = none), got {value!r:.40}")
    return float(value) or None


def _upload_path(upload) -> str:
    path = Path(upload) if isinstance(upload, str) and upload else None
    if path is None or not path.is_file():
        raise Refused("choose a .jsonl file to upload (one {\"prompt\": ...} or {\"messages\": [...]} per line)")
    if path.suffix.lower() != ".jsonl":
        raise Refused("the uploaded prompts must be a .jsonl file")
    if path.stat().st_size > MAX_UPLOAD_BYTES:
        raise Refused(f"the uploaded file is over {MAX_UPLOAD_BYTES // 1024} KiB")
    return str(path)


def flat_row(report: dict) -> dict:
    """A report's scalar figures for one CSV row; nested dicts (workload, config) become dotted columns. Printable
    multi-line sections (the roofline's text) stay in the JSON."""
    row = {}
    for key, value in report.items():
        if isinstance(value, dict):
            row.update({f"{key}.{k}": v for k, v in value.items() if not isinstance(v, dict | list)})
        elif not isinstance(value, list) and not (isinstance(value, str) and "\n" in value):
            row[key] = value
    return row


def runs_csv(reports: list[dict]) -> str:
    """Reports as CSV: one row per run, one column per figure (the bench's key names)."""
    rows = [flat_row(report) for report in reports]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def run_timeline(number: int, started: float, steps: list) -> Timeline:
    """Run `number` on the charts, in its own colour (the same whichever runs are shown with it)."""
    return Timeline(f"run {number}", started, steps, PALETTE[(number - 1) % len(PALETTE)])


class BenchmarkHandlers:
    """Benchmark tab handlers bound to the playground (its pool and limits)."""

    def __init__(self, app: Playground):
        self.app = app
        self._exports = tempfile.TemporaryDirectory(prefix="playground-bench-")

    @property
    def settings(self):
        return self.app.settings

    def parse(self, dataset, upload, num_requests, concurrency, request_rate, input_tokens, output_tokens,
              prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed) -> BenchmarkRequest:
        """The workload asked for, or Refused naming the first bad value or the cap it exceeds."""
        settings = self.settings
        if dataset not in DATASETS:
            raise Refused(f"dataset must be one of {', '.join(DATASETS)}")
        count = parse_int("requests", num_requests, 1, settings.max_bench_requests)
        in_flight = parse_int("concurrency", concurrency, 0, settings.max_bench_concurrency)
        rate = 0.0 if request_rate is None else request_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= MAX_RATE:
            raise Refused(f"request rate must be 0 (all at once) or up to {MAX_RATE:g} per second, got {rate!r:.40}")
        input_len, input_range = parse_length("input tokens", input_tokens, settings.max_prompt_tokens)
        output_len, output_range = parse_length("output tokens", output_tokens, settings.max_new_tokens)
        prefix = parse_int("shared prefix", prefix_tokens or 0, 0, settings.max_prompt_tokens)
        if not isinstance(ignore_eos, bool):
            raise Refused("ignore EOS must be true or false")
        if dataset == "random" and prefix + input_len > settings.max_prompt_tokens:
            raise Refused(f"shared prefix + input tokens = {prefix + input_len} is over this server's prompt cap of "
                          f"{settings.max_prompt_tokens} (PLAYGROUND_MAX_PROMPT_TOKENS)")
        tokens = count * ((prefix + input_len if dataset == "random" else 0) + output_len)
        if tokens > settings.max_bench_tokens:
            raise Refused(f"this run asks for up to {tokens:,} tokens, over this server's cap of "
                          f"{settings.max_bench_tokens:,} (PLAYGROUND_MAX_BENCH_TOKENS)")
        slos = {name: limit for name, limit in (("ttft", _objective("TTFT", slo_ttft_ms)),
                                                ("tpot", _objective("TPOT", slo_tpot_ms))) if limit}
        spec = WorkloadSpec(dataset=_upload_path(upload) if dataset == "upload" else dataset, num_prompts=count,
                            input_len=input_len if not input_range else input_range[0], input_len_range=input_range,
                            output_len=output_len, output_len_range=output_range,
                            prefix_len=prefix if dataset == "random" else 0,
                            request_rate=rate or math.inf, seed=parse_int("seed", seed or 0, 0, 2**31 - 1))
        return BenchmarkRequest(spec=spec, concurrency=min(in_flight or count, settings.max_bench_concurrency),
                                ignore_eos=ignore_eos, goodput_slos=slos)

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
                encoded = [BenchRequest(engine.encode(r.prompt), r.max_tokens, r.arrival) for r in workload]
            except EngineError as error:
                raise Refused(describe_error(error, settings.public)) from None
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
        """Start the run on the session's active configuration; yield its job every POLL_S until it ends.

        Closing this generator (the page went away) cancels the run and waits for its requests to end.
        """
        state = session.benchmark
        if state.job is not None and not state.job.done.is_set():
            raise Refused("a benchmark is already running in this tab: wait for it or press Cancel")
        config = dict(session.config)
        sampling = SamplingParams(seed=request.spec.seed, ignore_eos=request.ignore_eos)

        def work(job: MeasurementJob):
            return job.measure(self.app.pool, "this run", config, self._requests_for(request), sampling,
                               spec=request.spec, concurrency=request.concurrency, warmup=True,
                               goodput_slos=request.goodput_slos)

        state.job = MeasurementJob(work)
        yield from state.job.follow(POLL_S)

    def record(self, request: BenchmarkRequest, job: MeasurementJob, session: Session) -> BenchmarkRecord:
        """The finished run as a report with `engine.bench --json`'s keys, kept in the session's history."""
        if job.error is not None:
            raise Refused(describe_error(job.error, self.settings.public))
        run, state = job.result, session.benchmark
        report = bench_report(run.result, request.spec, request.concurrency, 0.0, request.ignore_eos, None,
                              request.goodput_slos)
        if self.settings.public:  # an uploaded file's server path is not the visitor's business
            report["workload"]["dataset"] = Path(report["workload"]["dataset"]).name
        spec = request.spec
        dataset = "random" if spec.dataset == "random" else ("chat" if spec.dataset == "chat" else "upload")
        label = (f"{config_tag(run.config, run.info)} · {dataset} ×{spec.num_prompts} · concurrency "
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
