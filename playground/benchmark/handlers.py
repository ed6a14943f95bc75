"""The Benchmark tab's handlers: Run (with its progress and live charts), Cancel, the overlay of earlier runs,
and `/benchmark` and `/cancel_benchmark` for API clients.

Why apart from the runs: these turn the tab's knobs into a workload (`benchmark/workload.py`), run it with
`BenchmarkRuns` and render what comes back (the tables and charts of `playground/figures/`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import gradio as gr

from playground.benchmark.runs import BenchmarkRuns, run_timeline
from playground.benchmark.workload import parse_workload
from playground.figures.configuration import config_summary
from playground.figures.run_charts import RUN_CHARTS, run_charts_html
from playground.figures.run_views import benchmark_table_html, history_table_html, notice_html, progress_html
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.session import Session, pack

INPUTS = ("bench_dataset", "bench_upload", "bench_requests", "bench_concurrency", "bench_rate", "bench_input",
          "bench_output", "bench_prefix", "bench_ignore_eos", "bench_slo_ttft", "bench_slo_tpot", "bench_seed",
          "bench_surge")
CHART_OUTPUTS = tuple(f"bench_{spec.name}" for spec in RUN_CHARTS)
RUN_OUTPUTS = ("bench_status", "bench_table", "bench_run", "bench_json", "bench_csv", "bench_overlay",
               "bench_history", *CHART_OUTPUTS)
OVERLAY_OUTPUTS = ("bench_history", *CHART_OUTPUTS)


class BenchmarkHandlers:
    """The tab's handlers over the context: parse the knobs, run them with `BenchmarkRuns`, render what it returns."""

    def __init__(self, context: PlaygroundContext):
        self.context = context
        self.runs = BenchmarkRuns(context)

    def _overlay_choices(self, session: Session) -> list[tuple[str, int]]:
        return [(f"run {run.number}: {run.label}", run.number) for run in reversed(session.benchmark.runs)]

    def run(self, *values) -> Iterator[tuple]:
        """Run: progress and live charts while it runs, then the table, exports and the run in the history."""
        *knobs, overlay, session = values
        session = self.context.session_of(session)
        idle = gr.Button(value="Run benchmark", interactive=True)
        try:
            request = parse_workload(self.context.settings, *knobs)
            earlier = self.runs.selected_runs(overlay, session)
            target = f"on {config_summary(session.config)}"
            for job in self.runs.run(request, session):
                if job.done.is_set():
                    break
                live = [run_timeline(session.benchmark.next_number, job.run_started, job.live_steps())] \
                    if job.run_started else []
                yield pack(RUN_OUTPUTS, {
                    "bench_status": progress_html(job, f"benchmark {target}"),
                    "bench_run": gr.Button(value="Running…", interactive=False),
                    **dict(zip(CHART_OUTPUTS, run_charts_html(self.runs.timelines(earlier) + live,
                                                              until=time.perf_counter()), strict=True))})
            record = self.runs.record(request, job, session)
        except Refused as refusal:
            yield pack(RUN_OUTPUTS, {"bench_status": notice_html("bad", str(refusal)), "bench_run": idle})
            return
        report = record.report
        cancelled = report["cancelled_requests"]
        ended = (f"stopped at this server's cap of {self.context.settings.max_measure_seconds} s "
                 "(PLAYGROUND_MAX_MEASURE_SECONDS)" if job.place.capped else "cancelled")
        status = (f"run {record.number} {ended}: {report['completed']} of {report['num_prompts']} requests "
                  "finished, the figures cover those" if cancelled else
                  f"run {record.number} done: {report['completed']} requests in {report['duration']:.2f} s on "
                  f"{record.summary}")
        if report["prefix_cache_hit_rate"] and request.spec.dataset == "random" and not request.spec.prefix_len:
            status += (" · its random prompts hit the prefix cache: an earlier run with this seed left them there "
                       "(another seed gives cold prompts)")
        if report["errors"]:
            status += f" · {report['errors']} request(s) failed, e.g. {report['first_error']}"
        for parameter, seen in report["ignored_parameters"].items():  # a served model's server, seen from here
            status += f" · the server did not honour {parameter}: {seen}"
        as_json, as_csv = self.runs.export_files(session, record)
        shown = [*earlier, record]
        yield pack(RUN_OUTPUTS, {
            "bench_status": notice_html("info" if cancelled or report["errors"] else "ok", status),
            "bench_table": benchmark_table_html(report), "bench_run": idle,
            "bench_json": gr.DownloadButton(value=as_json, interactive=True),
            "bench_csv": gr.DownloadButton(value=as_csv, interactive=True),
            "bench_overlay": gr.CheckboxGroup(choices=self._overlay_choices(session),
                                              value=[run.number for run in earlier]),
            "bench_history": history_table_html(shown),
            **dict(zip(CHART_OUTPUTS, run_charts_html(self.runs.timelines(shown)), strict=True)),
        })

    def cancel(self, session) -> None:
        """Cancel on the page (the run's own progress line then says it is cancelling)."""
        self.runs.cancel(session)

    def api_cancel(self, session) -> str:
        """Cancel: nothing more is sent, requests in flight are cancelled; the run ends with what finished."""
        return self.runs.cancel(session)

    def overlay(self, selected, session) -> tuple:
        """Earlier runs picked to overlay: their charts and a table of their figures, the newest run included."""
        session = self.context.session_of(session)
        runs = self.runs.selected_runs(selected, session)
        newest = session.benchmark.runs[-1:] if session.benchmark.runs else []
        shown = runs + [run for run in newest if run not in runs]
        return pack(OVERLAY_OUTPUTS, {"bench_history": history_table_html(shown),
                                      **dict(zip(CHART_OUTPUTS, run_charts_html(self.runs.timelines(shown)),
                                                 strict=True))})

    def api_benchmark(self, dataset, upload, requests, concurrency, request_rate, input_tokens, output_tokens,
                      prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed, surge,
                      session) -> Iterator[tuple[dict, str | None, str | None]]:
        """`/benchmark` for API clients, on this client's active configuration: while it waits for the measurement
        slot and runs, its progress (`MeasurementJob.progress`: phase, measurements ahead, requests done) and no
        files; then (the report, with `engine.bench --json`'s keys; its JSON file; the CSV of this client's runs).
        A refusal raises gr.Error; a client that goes away stops the run."""
        session = self.context.session_of(session)
        try:
            request = parse_workload(self.context.settings, dataset, upload, requests, concurrency, request_rate,
                                     input_tokens, output_tokens, prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms,
                                     seed, surge)
            for job in self.runs.run(request, session):
                if job.done.is_set():
                    break
                yield job.progress(), None, None
            record = self.runs.record(request, job, session)
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        as_json, as_csv = self.runs.export_files(session, record)
        yield record.report, as_json, as_csv
