"""The page: engine panel on the left, chat in the middle, live charts on the right.

Only layout and wiring live here; what each event does is in `handlers`, chart data in `charts`.
Every control of the engine panel is labelled with its EngineConfig field name, and every choice
the engine cannot use here says so (label and note) instead of pretending to work.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine import CHOICES, list_presets
from playground import charts
from playground.figures import header_html
from playground.handlers import FORM_FIELDS, Playground, availability_note, choice_label

CSS_PATH = Path(__file__).resolve().parent.parent / "assets" / "style.css"
THEME = gr.themes.Soft(
    primary_hue="indigo",
    neutral_hue="slate",
    font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
    font_mono=["JetBrains Mono", "ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
)
BLOCK_SIZES = [8, 16, 32, 64, 128, 256]
GQA_CHOICES = ["native", "mha", "1", "2", "4", "8"]
TP_CHOICES = [1, 2, 4, 8]
PLOT_HEIGHT = 160


def _radio(field_name: str, info: str, values=None) -> gr.Radio:
    values = values if values is not None else CHOICES[field_name]
    note = availability_note(field_name, values)
    return gr.Radio([choice_label(field_name, v) for v in values], label=field_name,
                    info=info + (f" · unavailable here: {note}" if note else ""), elem_classes=["ctl"])


def _dropdown(field_name: str, info: str, values) -> gr.Dropdown:
    note = availability_note(field_name, values)
    return gr.Dropdown([choice_label(field_name, v) for v in values], label=field_name,
                       info=info + (f" · unavailable here: {note}" if note else ""), elem_classes=["ctl"])


def _plot(spec: charts.ChartSpec):
    # y_lim starts every axis at 0: gradio's plots do not include zero by themselves, so a single bar
    # (one chat turn) would otherwise have no height.
    # The block label (not a plot title) names the chart, so it is named even before it has data.
    kwargs = dict(x=spec.x, y=spec.y, label=spec.title, show_label=True, x_title=spec.x_title,
                  y_title=spec.y_title, y_lim=[0, None], y_axis_format="~f", height=PLOT_HEIGHT,
                  elem_id=f"chart-{spec.name}", elem_classes=["chart"])
    if spec.color:
        kwargs["color"] = spec.color
    if spec is charts.TTFT:
        kwargs["tooltip"] = "all"
    if spec.kind == "bar":
        if spec is charts.MEMORY:
            kwargs["sort"] = list(charts.MEMORY_KINDS)
        return gr.BarPlot(**kwargs)
    return gr.LinePlot(x_lim=[-charts.WINDOW_S, 0], **kwargs)


def _engine_panel(app: Playground) -> dict:
    """The engine panel's controls by EngineConfig field name (plus the free model field)."""
    settings = app.settings
    controls: dict = {}
    model_choices = [(e.label or (f"{name} · {e.params}" if e.params else name), name)
                     for name, e in app.models.items()]
    # Custom values are allowed here and checked against the hosting limits when applied.
    notes = {name: entry.memory for name, entry in app.models.items() if entry.memory}

    def model_info(name: str) -> str:
        return notes.get(name) or "curated models (presets/models.toml)"

    controls["model"] = gr.Dropdown(model_choices, label="model", elem_classes=["ctl"], allow_custom_value=True,
                                    info=model_info(app.default_config["model"]))
    controls["model"].change(lambda name: gr.Dropdown(info=model_info(name)), controls["model"], controls["model"],
                             queue=False, show_progress="hidden", api_visibility="private")
    controls["custom_model"] = gr.Textbox(
        label="model: hub id or local path", placeholder="e.g. HuggingFaceTB/SmolLM2-135M-Instruct",
        info="overrides the list when set", visible=not settings.curated_only, elem_classes=["ctl"])
    with gr.Accordion("Execution", open=True, elem_classes=["group"]):
        controls["backend"] = _radio("backend", "native engine or plain transformers (baseline)")
        controls["dtype"] = _radio("dtype", "weight and activation precision")
        controls["quantization"] = _radio("quantization", "weight-only quantization level")
        controls["attention"] = _radio("attention", "attention kernel over the KV cache")
    with gr.Accordion("KV cache", open=True, elem_classes=["group"]):
        controls["kv_layout"] = _radio("kv_layout", "paged blocks, or one contiguous slab per sequence")
        controls["block_size"] = gr.Dropdown(BLOCK_SIZES, label="block_size", info="tokens per KV block",
                                             elem_classes=["ctl"])
        controls["prefix_caching"] = gr.Checkbox(label="prefix_caching", elem_classes=["ctl"],
                                                 info="reuse KV blocks of a shared prompt prefix (paged only)")
        controls["kv_cache_mib"] = gr.Number(label="kv_cache_bytes (MiB)", minimum=0, precision=0,
                                             info="KV budget; 0 = automatic", elem_classes=["ctl"])
    with gr.Accordion("Batching", open=True, elem_classes=["group"]):
        controls["batching"] = _radio("batching", "continuous: join and leave every step; static: whole batches")
        controls["max_num_seqs"] = gr.Slider(1, 64, step=1, label="max_num_seqs", elem_classes=["ctl"],
                                             info="most sequences in one batch")
    with gr.Accordion("Speculative decoding", open=False, elem_classes=["group"]):
        controls["speculative"] = _radio("speculative", "propose tokens cheaply, verify them in one pass")
        controls["draft_model"] = gr.Dropdown(
            [("(none)", "")] + [(n, n) for n in app.models], label="draft_model", elem_classes=["ctl"],
            allow_custom_value=True, info="the small model that proposes (draft mode)")
        controls["num_speculative_tokens"] = gr.Slider(1, 8, step=1, label="num_speculative_tokens",
                                                       info="tokens proposed per step", elem_classes=["ctl"])
    with gr.Accordion("Attention heads & parallelism", open=False, elem_classes=["group"]):
        controls["gqa"] = _dropdown("gqa", "native heads, MHA, or a number of KV heads (GQA/MQA)", GQA_CHOICES)
        controls["tensor_parallel_size"] = _dropdown("tensor_parallel_size", "shard the model over workers",
                                                     TP_CHOICES)
    return controls


def build_app(app: Playground) -> gr.Blocks:
    """The Gradio Blocks of the playground, wired to `app`'s handlers."""
    presets = list_presets()
    with gr.Blocks(title="Inference Playground", fill_width=True) as demo:
        session = gr.State(app.new_session())
        extras = gr.State({})
        header = gr.HTML(header_html(app.device, None, None, None), elem_id="header")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=3, min_width=300, elem_id="engine-panel"):
                gr.HTML('<div class="panel-title">Engine</div>')
                preset = gr.Dropdown(presets, value=None, label="optimization preset",
                                     info="a one-click starting point: fills the panel and applies it",
                                     elem_id="preset", elem_classes=["ctl"])
                controls = _engine_panel(app)
                pool_html = gr.HTML(elem_id="pool")
                with gr.Column(elem_id="apply-bar"):
                    check = gr.HTML(elem_id="check")
                    apply_btn = gr.Button("Apply", variant="primary", elem_id="apply")
                    status = gr.HTML(elem_id="apply-status")
            with gr.Column(scale=5, min_width=420, elem_id="chat-col"):
                chatbot = gr.Chatbot(
                    label="chat", show_label=False, height="calc(100vh - 350px)", min_height=380, elem_id="chat",
                    buttons=["copy"],
                    feedback_options=None, sanitize_html=True, layout="bubble",
                    placeholder="<div class='empty'><b>Chat with the engine.</b><br>Each reply carries its own "
                                "TTFT, decode speed and token counts; the charts on the right move while it "
                                "streams.</div>")
                with gr.Row(elem_id="composer"):
                    message = gr.Textbox(show_label=False, placeholder="Message the model… (Enter to send)",
                                         scale=8, elem_id="message", lines=1, max_lines=6)
                    send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="send")
                    stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="stop")
                with gr.Row(elem_id="sampling"):
                    max_new_tokens = gr.Slider(1, app.settings.max_new_tokens,
                                               value=min(128, app.settings.max_new_tokens), step=1,
                                               label="max_tokens", info="new tokens per reply", elem_id="max-tokens")
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature",
                                            info="0 = greedy")
                    clear = gr.Button("Clear chat", size="sm", elem_id="clear", min_width=80)
                figures = gr.JSON(visible=False, label="last reply figures")
            with gr.Column(scale=4, min_width=340, elem_id="charts-col"):
                plots = [_plot(spec) for spec in charts.ALL_CHARTS]
        timer = gr.Timer(2.0)

        form = [controls[name] for name in FORM_FIELDS]
        demo.load(app.page_load, [session], [header, *form, session, pool_html], queue=False,
                  api_visibility="private").then(
            app.chart_frames, [session], plots, show_progress="hidden", api_visibility="private")
        for control in form:
            control.input(app.check, [*form, extras, session], [check, apply_btn], queue=False,
                          show_progress="hidden", api_visibility="private")
        apply_event = apply_btn.click(
            app.apply, [*form, extras, session], [header, status, apply_btn, session, pool_html],
            api_name="apply", concurrency_limit=1, concurrency_id="engine-load", show_progress="hidden")
        apply_event.then(app.chart_frames, [session], plots, show_progress="hidden", api_visibility="private")
        preset.input(app.preset, [preset, session], [*form, extras, check], api_visibility="private").then(
            app.apply, [*form, extras, session], [header, status, apply_btn, session, pool_html],
            concurrency_limit=1, concurrency_id="engine-load", show_progress="hidden", api_visibility="private").then(
            app.chart_frames, [session], plots, show_progress="hidden", api_visibility="private")
        chat_event = gr.on(
            [message.submit, send.click], app.chat, [message, max_new_tokens, temperature, session],
            [chatbot, message, session, figures, *plots], api_name="chat",
            concurrency_limit=app.settings.max_concurrent_chats, show_progress="hidden")
        stop.click(None, cancels=[chat_event]).then(
            app.stopped, [session], [chatbot, session, figures, *plots], api_visibility="private")
        clear.click(app.clear, [session], [chatbot, session, figures], api_visibility="private")
        # Ticks bypass the queue, so open tabs never fill PLAYGROUND_MAX_QUEUE with chart refreshes.
        timer.tick(app.refresh, [session], [*plots, pool_html, header], show_progress="hidden",
                   api_visibility="private", queue=False)
    return demo
