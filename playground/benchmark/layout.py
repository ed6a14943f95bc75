"""The Benchmark tab's layout and wiring: the workload's knobs, Run and Cancel, the exports, the progress and
live charts, the table of percentiles, and this session's earlier runs to overlay.

While a run goes, the page shows a progress bar and live charts (output tokens per second, running
batch, KV blocks in use); Cancel bypasses the queue and ends the run cleanly. Runs share the
server's measurement slot with Compare and the roofline probe (`shared/measurement_slot.py`): while
one waits for it the progress line says how many measurements are ahead. `/benchmark` (which
streams the same progress until its report) and `/cancel_benchmark` serve API clients.
"""

from __future__ import annotations

import gradio as gr

from playground.benchmark.handlers import INPUTS, OVERLAY_OUTPUTS, RUN_OUTPUTS, BenchmarkHandlers
from playground.benchmark.workload import DATASETS
from playground.figures.run_charts import CHARTS_NOTE, RUN_CHARTS, run_charts_html
from playground.shared.settings import Settings

# element id -> glossary term, for the tooltips
TOOLTIPS = {"bench-dataset": "bench_dataset", "bench-requests": "bench_requests",
            "bench-concurrency": "bench_concurrency", "bench-rate": "bench_rate", "bench-input": "bench_input",
            "bench-output": "bench_output", "bench-prefix": "bench_prefix", "bench-ignore-eos": "bench_ignore_eos",
            "bench-slo-ttft": "bench_slo_ttft", "bench-slo-tpot": "bench_slo_tpot", "bench-seed": "bench_seed",
            "bench-surge": "bench_surge"}


def build_benchmark_tab(settings: Settings, ui: dict) -> None:
    """The Benchmark tab's components, added to `ui` under their names (wired by `wire_benchmark_tab`)."""
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
        slowest = f", else at least {settings.min_bench_rate:g}" if settings.min_bench_rate else ""
        ui["bench_rate"] = gr.Number(0, label=f"request rate /s (0 = all at once{slowest})", minimum=0,
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
        ui["bench_surge"] = gr.Textbox("", label="surge COUNT:INPUT:OUTPUT (empty = none)", elem_id="bench-surge",
                                       max_length=40, placeholder="e.g. 8:512:32")
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


def wire_benchmark_tab(benchmark: BenchmarkHandlers, ui: dict, session) -> None:
    """The tab's events; `/benchmark` and `/cancel_benchmark` for API clients."""
    private = {"api_visibility": "private"}
    # Runs wait for the measurement slot inside their handler (showing their place), so the queue lets them all in.
    measure = dict(concurrency_limit=benchmark.context.settings.max_measure_waiting + 1, concurrency_id="measure-queue",
                   show_progress="hidden")
    knobs = [ui[name] for name in INPUTS]
    ui["bench_dataset"].change(lambda dataset: gr.File(visible=dataset == "upload"), ui["bench_dataset"],
                               ui["bench_upload"], queue=False, show_progress="hidden", **private)
    ui["bench_run"].click(benchmark.run, [*knobs, ui["bench_overlay"], session], [ui[name] for name in RUN_OUTPUTS],
                          **measure, **private)
    ui["bench_cancel"].click(benchmark.cancel, [session], None, queue=False, **private)
    ui["bench_overlay"].input(benchmark.overlay, [ui["bench_overlay"], session], [ui[name] for name in OVERLAY_OUTPUTS],
                              queue=False, show_progress="hidden", **private)
    with gr.Group(visible=False):
        report, as_json, as_csv, cancelled = gr.JSON(), gr.File(), gr.File(), gr.Textbox()
        run, cancel = gr.Button("benchmark"), gr.Button("cancel_benchmark")
    # preprocess=False: the handler parses every raw value (Gradio's own number checks raised on text); an upload
    # arrives as Gradio's file record, already moved into its upload cache
    run.click(benchmark.api_benchmark, [*knobs, session], [report, as_json, as_csv], api_name="benchmark",
              preprocess=False, **measure)
    cancel.click(benchmark.api_cancel, [session], cancelled, api_name="cancel_benchmark", queue=False,
                 preprocess=False)
