"""The Roofline tab's layout and wiring: which steps to place, Run probe, Refresh, Measure ceilings again, the
chart and its summary, the what-if projection onto other devices, and `/roofline` for API clients.
"""

from __future__ import annotations

import gradio as gr

from playground.figures.projection_view import projection_html
from playground.figures.roofline_chart import roofline_summary_html, roofline_svg
from playground.roofline.handlers import EVERYTHING, OUTPUTS, WINDOWS, RooflineHandlers

# element id -> glossary term, for the tooltips
TOOLTIPS = {"rl-window": "roofline_window", "rl-probe": "roofline_probe", "rl-remeasure": "roofline_remeasure",
            "rl-chart": "ceilings", "rl-projection": "projected_step"}
INTRO = ("**Roofline**: where this configuration's steps sit against the limits of this device. A step that "
         "reads more bytes than it does arithmetic per byte (decode: every weight for one token per sequence) is "
         "limited by memory bandwidth (the slope); one with enough arithmetic per byte (a long prefill) by the "
         "matmul peak (the flat roof). FLOPs and bytes are counted from the model's shapes and each step's batch "
         "(weights read once per step at their real, quantized if so, size; K/V read and written; attention's "
         "query-key pairs); the ceilings are measured on this machine once and cached. **Run probe** sends a "
         "short workload to the active engine (1, then 4, then 16 sequences of 128 prompt tokens, 32 out). Below, "
         "**what-if hardware**: the same steps' work priced on GPUs from their published FLOP/s and bandwidth, plus "
         "a per-step overhead fitted to the committed GPU runs: estimates, not measurements.")


def build_roofline_tab(ui: dict) -> None:
    """The tab's components, added to `ui` by name (call inside `with gr.Tab(...)`)."""
    gr.Markdown(INTRO, elem_id="rl-intro")
    with gr.Row(elem_id="rl-controls"):
        ui["rl_window"] = gr.Radio(list(WINDOWS), value=EVERYTHING, label="steps to place", elem_id="rl-window",
                                   info="the probe's, the last minute's, or every step the engine recorded (all "
                                        "sessions on this engine; up to the last 4096)")
        ui["rl_probe"] = gr.Button("Run probe", variant="primary", elem_id="rl-probe", scale=0, min_width=120)
        ui["rl_show"] = gr.Button("Refresh", elem_id="rl-show", scale=0, min_width=100)
        ui["rl_remeasure"] = gr.Button("Measure ceilings again", elem_id="rl-remeasure", scale=0, min_width=160)
    ui["rl_chart"] = gr.HTML(roofline_svg(None), elem_id="rl-chart", elem_classes=["chart-html"])
    ui["rl_summary"] = gr.HTML(roofline_summary_html(None, "Run probe, or Refresh after chatting."),
                               elem_id="rl-summary")
    ui["rl_projection"] = gr.HTML(projection_html(None), elem_id="rl-projection")
    ui["rl_report"] = gr.JSON(visible=False, label="roofline report")
    ui["rl_probe_started"] = gr.State(0.0)


def wire_roofline_tab(roofline: RooflineHandlers, tab: gr.Tab, ui: dict, session) -> None:
    """The tab's events, `/roofline` for API clients, and the recorded steps shown whenever the tab is opened. The
    probe shares the "measure" slot with the other measuring tabs (one at a time)."""
    outputs = [ui[name] for name in OUTPUTS]
    state = [ui["rl_window"], ui["rl_probe_started"], session]
    private = {"api_visibility": "private", "show_progress": "minimal"}
    ui["rl_probe"].click(roofline.probe, [session], outputs, concurrency_limit=1, concurrency_id="measure", **private)
    ui["rl_show"].click(roofline.show, state, outputs, **private)
    ui["rl_window"].input(roofline.show, state, outputs, **private)
    ui["rl_remeasure"].click(roofline.remeasure, state, outputs, concurrency_limit=1, concurrency_id="measure",
                             **private)
    with gr.Group(visible=False):
        probe, report, button = gr.Checkbox(label="probe"), gr.JSON(label="roofline"), gr.Button("roofline")
    button.click(roofline.api_roofline, [probe, session], report, api_name="roofline", concurrency_limit=1,
                 concurrency_id="measure", preprocess=False)  # the handler takes only `true` as "run the probe"
    tab.select(roofline.show, state, outputs, queue=False, show_progress="hidden", api_visibility="private")
