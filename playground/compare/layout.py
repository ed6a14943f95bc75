"""The Compare tab's layout and wiring: two sides (each the engine panel or a preset, with changes), the
prompts and sampling both share, Run and Stop, the table, the overlaid charts, both outputs, and "chat
with both".

Every control has an element id (`cmp-...`) that the glossary names for its tooltip. A comparison
takes the server's measurement slot (`shared/measurement_slot.py`), shared with the Benchmark and
Roofline tabs, so two measurements never run at once on this server, and shows its place while it
waits; Stop bypasses the queue. `/compare` serves API clients its progress, then the comparison as
plain data (the same dict the tab renders).
"""

from __future__ import annotations

import gradio as gr

from engine import unavailable_reason
from playground.compare.handlers import CHAT_INPUTS, CHAT_OUTPUTS, INPUTS, RUN_OUTPUTS, SIDE_INPUTS, CompareHandlers
from playground.compare.request import BASELINES, NO_BASELINE, PANEL, STRUCTURED_SIDES
from playground.figures.run_charts import CHARTS_NOTE, RUN_CHARTS, run_charts_html
from playground.shared.context import PlaygroundContext
from playground.shared.structured_output import CHOICES, OFF

DEFAULT_PROMPTS = "What does json.dumps do?\nHow do I use pathlib.Path?"
DEFAULT_B = "speculative-draft"
# element id -> glossary term, for the tooltips
TOOLTIPS = {"cmp-a-source": "compare_side", "cmp-b-source": "compare_side", "cmp-a-changes": "compare_changes",
            "cmp-b-changes": "compare_changes", "cmp-prompts": "compare_prompts", "cmp-max-tokens": "max_tokens",
            "cmp-temperature": "temperature", "cmp-top-p": "top_p", "cmp-top-k": "top_k", "cmp-seed": "sample_seed",
            "cmp-repeats": "compare_repeats", "cmp-baseline": "compare_baseline",
            "cmp-perplexity": "compare_perplexity", "cmp-chat": "chat_both", "cmp-structured": "structured_output",
            "cmp-structured-spec": "structured_spec", "cmp-structured-sides": "compare_structured_sides",
            "cmp-surge": "compare_surge"}


def baseline_choices() -> list[str]:
    """The baselines this host can run (llama.cpp's only where llama-cpp-python is installed)."""
    return [NO_BASELINE, *(name for name, fields in BASELINES.items()
                           if not unavailable_reason("backend", fields["backend"]))]


def build_compare_tab(context: PlaygroundContext, ui: dict) -> None:
    """The Compare tab's components, added to `ui` under their names (wired by `wire_compare_tab`)."""
    settings = context.settings
    sources = [PANEL, *context.presets]
    gr.HTML('<div class="tab-intro">Two configurations on the same prompts, with the same seed and sampling: each '
            'side runs alone (never interleaved), repeats alternate the order, and the table gives B / A. Both '
            'engines come from the shared pool, under its memory budget.</div>')
    with gr.Row(equal_height=False, elem_id="cmp-sides"):
        for side, default in (("a", PANEL), ("b", DEFAULT_B if DEFAULT_B in context.presets else PANEL)):
            with gr.Column(elem_classes=["cmp-side"], min_width=280):
                ui[f"cmp_{side}_source"] = gr.Dropdown(sources, value=default, label=f"{side.upper()}: start from",
                                                       elem_id=f"cmp-{side}-source")
                ui[f"cmp_{side}_changes"] = gr.Textbox(
                    "", label=f"{side.upper()}: changes", lines=1, max_lines=4, elem_id=f"cmp-{side}-changes",
                    placeholder="KEY=VALUE, e.g. quantization=int8, prefix_caching=false", max_length=2000)
                ui[f"cmp_{side}_resolved"] = gr.HTML(elem_id=f"cmp-{side}-resolved")
    ui["cmp_baseline_resolved"] = gr.HTML(elem_id="cmp-baseline-resolved")
    ui["cmp_prompts"] = gr.Textbox(DEFAULT_PROMPTS, label="prompts (one per line)", lines=2, max_lines=8,
                                   elem_id="cmp-prompts", max_length=8 * settings.max_message_chars)
    with gr.Row(elem_id="cmp-sampling"):
        ui["cmp_max_tokens"] = gr.Slider(1, settings.max_new_tokens, value=min(48, settings.max_new_tokens), step=1,
                                         label="max_tokens", elem_id="cmp-max-tokens")
        ui["cmp_temperature"] = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature",
                                          elem_id="cmp-temperature")
        ui["cmp_top_p"] = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top_p", elem_id="cmp-top-p")
        ui["cmp_top_k"] = gr.Number(value=0, label="top_k", precision=0, minimum=0, elem_id="cmp-top-k")
        ui["cmp_seed"] = gr.Number(value=0, label="seed", precision=0, minimum=0, elem_id="cmp-seed")
        ui["cmp_repeats"] = gr.Slider(1, 5, value=1, step=1, label="repeats", elem_id="cmp-repeats")
    with gr.Row(elem_id="cmp-structured-row"):
        ui["cmp_structured"] = gr.Dropdown(list(CHOICES), value=OFF, label="structured output", scale=1,
                                           elem_id="cmp-structured")
        ui["cmp_structured_spec"] = gr.Textbox("", label="schema or regex", lines=1, max_lines=6, scale=3,
                                               elem_id="cmp-structured-spec", max_length=settings.max_message_chars)
        ui["cmp_structured_sides"] = gr.Radio(list(STRUCTURED_SIDES), value=STRUCTURED_SIDES[0], label="for", scale=1,
                                              elem_id="cmp-structured-sides")
    with gr.Row(elem_id="cmp-actions"):
        ui["cmp_baseline"] = gr.Dropdown(baseline_choices(), value=NO_BASELINE, label="+ baseline",
                                         info="a reference engine on A's model, every other field at its default",
                                         elem_id="cmp-baseline")
        ui["cmp_perplexity"] = gr.Checkbox(False, label="measure perplexity", elem_id="cmp-perplexity")
        ui["cmp_surge"] = gr.Textbox("", label="surge", elem_id="cmp-surge", max_length=40,
                                     placeholder="COUNT:INPUT:OUTPUT, e.g. 8:512:32 (empty = none)")
        ui["cmp_run"] = gr.Button("Run comparison", variant="primary", elem_id="cmp-run")
        ui["cmp_stop"] = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
    ui["cmp_status"] = gr.HTML(elem_id="cmp-status")
    ui["cmp_table"] = gr.HTML(elem_id="cmp-table")
    with gr.Row(elem_id="cmp-charts"):
        for chart, empty in zip(RUN_CHARTS, run_charts_html([]), strict=True):
            ui[f"cmp_{chart.name}"] = gr.HTML(empty, elem_id=f"cmp-chart-{chart.name}", elem_classes=["run-chart"])
    gr.HTML(f'<div class="run-note">{CHARTS_NOTE}</div>')
    ui["cmp_outputs"] = gr.HTML(elem_id="cmp-outputs")
    with gr.Accordion("Chat with both", open=False, elem_id="cmp-chat"):
        with gr.Row(equal_height=False):
            for label, name in (("A", "cmp_chat_a"), ("B", "cmp_chat_b"), ("baseline", "cmp_chat_baseline")):
                ui[name] = gr.Chatbot(label=label, height=320, elem_id=name.replace("_", "-"), sanitize_html=True,
                                      layout="bubble", visible=label != "baseline", buttons=["copy"])
        ui["cmp_notice"] = gr.HTML(elem_id="cmp-notice")
        with gr.Row():
            ui["cmp_message"] = gr.Textbox(label="message to every side", show_label=False, scale=8,
                                           placeholder="Message A and B… (Enter to send)", elem_id="cmp-message",
                                           max_length=settings.max_message_chars)
            ui["cmp_send"] = gr.Button("Send to both", variant="primary", scale=1, elem_id="cmp-send")
            ui["cmp_chat_clear"] = gr.Button("Clear", scale=1, elem_id="cmp-chat-clear")


def wire_compare_tab(compare: CompareHandlers, tab: gr.Tab, ui: dict, form: list, extras, session) -> None:
    """The tab's events (each takes the engine panel's values `form` and `extras` after its own controls),
    `/compare` for API clients, and the sides' lines brought up to date whenever the tab is opened."""
    private = {"api_visibility": "private"}
    # Comparisons wait for the measurement slot inside their handler (showing their place), so the queue lets them in.
    measure = dict(concurrency_limit=compare.context.settings.max_measure_waiting + 1,
                   concurrency_id="measure-queue", show_progress="hidden")
    inputs = [ui[name] for name in INPUTS] + form + [extras, session]
    side_inputs = [ui[name] for name in SIDE_INPUTS] + form + [extras, session]
    resolved = [ui["cmp_a_resolved"], ui["cmp_b_resolved"], ui["cmp_baseline_resolved"]]
    for name in ("cmp_a_source", "cmp_b_source", "cmp_baseline", "cmp_a_changes", "cmp_b_changes"):
        ui[name].change(compare.describe, side_inputs, resolved, queue=False, show_progress="hidden", **private)
    ui["cmp_run"].click(compare.run, inputs, [ui[name] for name in RUN_OUTPUTS], **measure, **private)
    chat_inputs = [ui[name] for name in CHAT_INPUTS] + form + [extras, session]
    chat_outputs = [ui[name] for name in CHAT_OUTPUTS]
    gr.on([ui["cmp_message"].submit, ui["cmp_send"].click], compare.chat_send, chat_inputs, chat_outputs,
          concurrency_limit=1, concurrency_id="measure", show_progress="hidden", **private)
    ui["cmp_stop"].click(compare.stop, [session], None, queue=False, **private)
    ui["cmp_chat_clear"].click(compare.chat_clear, [session], chat_outputs, queue=False, **private)
    with gr.Group(visible=False):
        result = gr.JSON(label="comparison")
        button = gr.Button("compare")
    # preprocess=False: the handler parses every raw value (Gradio's own number checks raised on text)
    button.click(compare.api_compare, [ui[name] for name in INPUTS] + [session], result, api_name="compare",
                 preprocess=False, **measure)
    tab.select(compare.describe, side_inputs, resolved, queue=False, show_progress="hidden", **private)
