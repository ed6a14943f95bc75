"""The Benchmark tab: its layout, its wiring, and the glue between its controls and `BenchmarkHandlers`.

While a run goes, the page shows a progress bar and live charts (output tokens per second, running
batch, KV blocks in use); Cancel bypasses the queue and ends the run cleanly. Afterwards: the table of
percentiles, the exports, and this session's earlier runs to overlay. Runs share one concurrency slot
with Compare ("measure"). `/benchmark` and `/cancel_benchmark` serve API clients.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import gradio as gr

from playground.benchmark import DATASETS, BenchmarkHandlers, run_timeline
from playground.errors import Refused
from playground.figures import config_summary
from playground.run_charts import CHARTS_NOTE, RUN_CHARTS, run_charts_html
from playground.run_views import benchmark_table_html, history_table_html, notice_html, progress_html
from playground.session import Session, pack

if TYPE_CHECKING:
    from playground.handlers import Playground

INPUTS = ("bench_dataset", "bench_upload", "bench_requests", "bench_concurrency", "bench_rate", "bench_input",
          "bench_output", "bench_prefix", "bench_ignore_eos", "bench_slo_ttft", "bench_slo_tpot", "bench_seed")
CHART_OUTPUTS = tuple(f"bench_{spec.name}" for spec in RUN_CHARTS)
RUN_OUTPUTS = ("bench_status", "bench_table", "bench_run", "bench_json", "bench_csv", "bench_overlay",
               "bench_history", *CHART_OUTPUTS)
OVERLAY_OUTPUTS = ("bench_history", *CHART_OUTPUTS)
TOOLTIPS = {"bench-dataset": "bench_dataset", "bench-requests": "bench_requests",
            "bench-concurrency": "bench_concurrency", "bench-rate": "bench_rate", "bench-input": "bench_input",
            "bench-output": "bench_output", "bench-prefix": "bench_prefix", "bench-ignore-eos": "bench_ignore_eos",
            "bench-slo-ttft": "bench_slo_ttft", "bench-slo-tpot": "bench_slo_tpot", "bench-seed": "bench_seed"}


class BenchmarkTab:
    """The tab's event handlers: parse the knobs, run `app.benchmark`, render what it returns."""

    def __init__(self, app: Playground):
        self.app = app
        self.benchmark: BenchmarkHandlers = app.benchmark

    def _overlay_choices(self, session: Session) -> list[tuple[str, int]]:
        return [(f"run {run.number}: {run.label}", run.number) for run in reversed(session.benchmark.runs)]

    def run(self, *values) -> Iterator[tuple]:
        """Run: progress and live charts while it runs, then the table, exports and the run in the history."""
        *knobs, overlay, session = values
        session = self.app.session_of(session)
        idle = gr.Button(value="Run benchmark", interactive=True)
        try:
            request = self.benchmark.parse(*knobs)
            earlier = self.benchmark.selected_runs(overlay, session)
            target = f"on {config_summary(session.config)}"
            for job in self.benchmark.run(request, session):
                if job.done.is_set():
                    break
                live = [run_timeline(session.benchmark.next_number, job.run_started, job.live_steps())] \
                    if job.run_started else []
                yield pack(RUN_OUTPUTS, {
                    "bench_status": progress_html(job, f"benchmark {target}"),
                    "bench_run": gr.Button(value="Running…", interactive=False),
                    **dict(zip(CHART_OUTPUTS, run_charts_html(self.benchmark.timelines(earlier) + live,
                                                              until=time.perf_counter()), strict=True))})
            record = self.benchmark.record(request, job, session)
        except Refused as refusal:
            yield pack(RUN_OUTPUTS, {"bench_status": notice_html("bad", str(refusal)), "bench_run": idle})
            return
        report = record.report
        cancelled = report["cancelled_requests"]
        status = (f"run {record.number} cancelled: {report['completed']} of {report['num_prompts']} requests "
                  "finished, the figures cover those" if cancelled else
                  f"run {record.number} done: {report['completed']} requests in {report['duration']:.2f} s on "
                  f"{record.summary}")
        if report["prefix_cache_hit_rate"] and request.spec.dataset == "random" and not request.spec.prefix_len:
            status += (" · its random prompts hit the prefix cache: an earlier run with this seed left them there "
                       "(another seed gives cold prompts)")
        if report["errors"]:
            status += f" · {report['errors']} request(s) failed, e.g. {report['first_error']}"
        as_json, as_csv = self.benchmark.export_files(session, record)
        shown = [*earlier, record]
        yield pack(RUN_OUTPUTS, {
            "bench_status": notice_html("info" if cancelled or report["errors"] else "ok", status),
            "bench_table": benchmark_table_html(report), "bench_run": idle,
            "bench_json": gr.DownloadButton(value=as_json, interactive=True),
            "bench_csv": gr.DownloadButton(value=as_csv, interactive=True),
            "bench_overlay": gr.CheckboxGroup(choices=self._overlay_choices(session),
                                              value=[run.number for run in earlier]),
            "bench_history": history_table_html(shown),
            **dict(zip(CHART_OUTPUTS, run_charts_html(self.benchmark.timelines(shown)), strict=True)),
        })

    def cancel(self, session) -> None:
        """Cancel on the page (the run's own progress line then says it is cancelling)."""
        self.benchmark.cancel(session)

    def overlay(self, selected, session) -> tuple:
        """Earlier runs picked to overlay: their charts and a table of their figures, the newest run included."""
        session = self.app.session_of(session)
        runs = self.benchmark.selected_runs(selected, session)
        newest = session.benchmark.runs[-1:] if session.benchmark.runs else []
        shown = runs + [run for run in newest if run not in runs]
        return pack(OVERLAY_OUTPUTS, {"bench_history": history_table_html(shown),
                                      **dict(zip(CHART_OUTPUTS, run_charts_html(self.benchmark.timelines(shown)),
                                                 strict=True))})

    def api_benchmark(self, dataset, upload, requests, concurrency, request_rate, input_tokens, output_tokens,
                      prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed, session) -> tuple[dict, str, str]:
        """`/benchmark` for API clients, on this client's active configuration: (the report, with `engine.bench
        --json`'s keys; its JSON file; the CSV of this client's runs). A refusal raises gr.Error."""
        session = self.app.session_of(session)
        try:
            request = self.benchmark.parse(dataset, upload, requests, concurrency, request_rate, input_tokens,
                                           output_tokens, prefix_tokens, ignore_eos, slo_ttft_ms, slo_tpot_ms, seed)
            for job in self.benchmark.run(request, session):
                if job.done.is_set():
                    break
            record = self.benchmark.record(request, job, session)
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        as_json, as_csv = self.benchmark.export_files(session, record)
        return record.report, as_json, as_csv


def build_benchmark_tab(app: Playground, ui: dict) -> BenchmarkTab:
    """The Benchmark tab's components, added to `ui` under their names (wired by `wire_benchmark_tab`)."""
    tab = BenchmarkTab(app)
    settings = app.settings
    gr.HTML('<div class="tab-intro">A workload on the engine panel\'s <b>active</b> configuration (Apply another to '
            'benchmark it), measured as <code>python -m engine.bench</code> measures it. Other sessions\' requests '
            'on the same engine share its batches.</div>')
    with gr.Row(elem_id="bench-knobs-1"):
        ui["bench_dataset"] = gr.Radio(list(DATASETS), value="random", label="dataset", elem_id="bench-dataset")
        ui["bench_upload"] = gr.File(label="prompts (.jsonl)", file_types=[".jsonl"], type="filepath",
                                     elem_id="bench-upload", visible=False, height=90)
        ui["bench_requests"] = gr.Number(16, label="requests", precision=0, minimum=1,
                                         maximum=settings.max_bench_requests, elem_id="bench-requests")
        ui["bench_concurrency"] = gr.Number(0, label="concurrency (0 = all)", precision=0, minimum=0,
                                            maximum=settings.max_bench_concurrency, elem_id="bench-concurrency")
        ui["bench_rate"] = gr.Number(0, label="request rate /s (0 = all at once)", minimum=0,
                                     elem_id="bench-rate")
        ui["bench_seed"] = gr.Number(0, label="seed", precision=0, minimum=0, elem_id="bench-seed")
    with gr.Row(elem_id="bench-knobs-2"):
        ui["bench_input"] = gr.Textbox("64", label="input tokens (N or LO:HI)", elem_id="bench-input", max_length=20)
        ui["bench_output"] = gr.Textbox("32", label="output tokens (N or LO:HI)", elem_id="bench-output",
                                        max_length=20)
        ui["bench_prefix"] = gr.Number(0, label="shared prefix tokens", precision=0, minimum=0,
                                       elem_id="bench-prefix")
        ui["bench_slo_ttft"] = gr.Number(0, label="TTFT objective ms (0 = none)", minimum=0,
                                         elem_id="bench-slo-ttft")
        ui["bench_slo_tpot"] = gr.Number(0, label="TPOT objective ms (0 = none)", minimum=0,
                                         elem_id="bench-slo-tpot")
        ui["bench_ignore_eos"] = gr.Checkbox(True, label="ignore EOS", elem_id="bench-ignore-eos")
    with gr.Row(elem_id="bench-actions"):
        ui["bench_run"] = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
        ui["bench_cancel"] = gr.Button("Cancel", variant="stop", elem_id="bench-cancel")
        ui["bench_json"] = gr.DownloadButton("Export JSON", interactive=False, elem_id="bench-json")
        ui["bench_csv"] = gr.DownloadButton("Export CSV", interactive=False, elem_id="bench-csv")
    ui["bench_status"] = gr.HTML(elem_id="bench-status")
    with gr.Row(elem_id="bench-charts"):
        for chart, empty in zip(RUN_CHARTS, run_charts_html([]), strict=True):
            ui[f"bench_{chart.name}"] = gr.HTML(empty, elem_id=f"bench-chart-{chart.name}",
                                                elem_classes=["run-chart"])
    gr.HTML(f'<div class="run-note">{CHARTS_NOTE}</div>')
    ui["bench_table"] = gr.HTML(elem_id="bench-table")
    with gr.Accordion("Earlier runs of this session", open=True, elem_id="bench-earlier"):
        ui["bench_overlay"] = gr.CheckboxGroup([], value=[], label="overlay and compare with", type="value",
                                               elem_id="bench-overlay")
        ui["bench_history"] = gr.HTML(elem_id="bench-history")
    return tab


def wire_benchmark_tab(tab: BenchmarkTab, ui: dict, session) -> None:
    """The tab's events; `/benchmark` and `/cancel_benchmark` for API clients."""
    private = {"api_visibility": "private"}
    measure = dict(concurrency_limit=1, concurrency_id="measure", show_progress="hidden")
    knobs = [ui[name] for name in INPUTS]
    ui["bench_dataset"].change(lambda dataset: gr.File(visible=dataset == "upload"), ui["bench_dataset"],
                               ui["bench_upload"], queue=False, show_progress="hidden", **private)
    ui["bench_run"].click(tab.run, [*knobs, ui["bench_overlay"], session], [ui[name] for name in RUN_OUTPUTS],
                          **measure, **private)
    ui["bench_cancel"].click(tab.cancel, [session], None, queue=False, **private)
    ui["bench_overlay"].input(tab.overlay, [ui["bench_overlay"], session], [ui[name] for name in OVERLAY_OUTPUTS],
                              queue=False, show_progress="hidden", **private)
    with gr.Group(visible=False):
        report, as_json, as_csv, cancelled = gr.JSON(), gr.File(), gr.File(), gr.Textbox()
        run, cancel = gr.Button("benchmark"), gr.Button("cancel_benchmark")
    run.click(tab.api_benchmark, [*knobs, session], [report, as_json, as_csv], api_name="benchmark", **measure)
    cancel.click(tab.benchmark.cancel, [session], cancelled, api_name="cancel_benchmark", queue=False)
