"""The chat tab's layout and wiring: the chat box with its composer, example questions, sampling controls and
exports; the live charts beside it; the page's report of the wait it measured; `/chat`, `/clear`, `/export`.

The charts are drawn by `playground/figures/live_charts.py` and refreshed by `chat/charts.py` while a
reply streams (and by the page's timer). On a narrow screen the chat comes first (assets/style.css).
"""

from __future__ import annotations

import gradio as gr

from playground.chat.charts import LiveCharts
from playground.chat.handlers import CHAT_OUTPUTS, LATENCY_OUTPUTS, ChatHandlers
from playground.chat.measure import DEFAULT_REPEATS
from playground.figures import live_charts
from playground.figures.features import features_html
from playground.shared.settings import Settings
from playground.shared.structured_output import CHOICES, OFF

STORAGE_KEY = "inference-playground-conversation"
SAMPLING = ("system_prompt", "max_tokens", "temperature", "top_p", "top_k", "sample_seed", "stop_strings")
# what the chat box sends: the sampling (as `/chat` takes it), then structured output and token probabilities
CHAT_SETTINGS = (*SAMPLING, "structured", "structured_spec", "token_probs")
SPEC_PLACEHOLDER = 'a JSON schema, e.g. {"type": "object", "properties": {…}}, or a regex, e.g. (yes|no)'
# element id -> glossary term, for the tooltips
TOOLTIPS = {"system-prompt": "system_prompt", "max-tokens": "max_tokens", "temperature": "temperature",
            "top-p": "top_p", "top-k": "top_k", "sample-seed": "sample_seed", "stop-strings": "stop_strings",
            "measure-ppl": "measure_perplexity", "structured": "structured_output",
            "structured-spec": "structured_spec", "token-probs": "token_probabilities"}
PRIVATE = {"api_visibility": "private"}


def build_chat_column(settings: Settings, ui: dict) -> None:
    """The chat box, its composer, example questions, sampling controls and exports, added to `ui` by name."""
    ui["chatbot"] = gr.Chatbot(
        label="chat", show_label=False, height="calc(100vh - 420px)", min_height=360, elem_id="chat",
        buttons=["copy"], editable="user", feedback_options=None, sanitize_html=True, layout="bubble",
        placeholder="<div class='empty'><b>Chat with the engine.</b><br>Each reply carries its own figures: the "
                    "engine's TTFT and your wait from Enter to the first text, decode speed and token counts. The "
                    "charts move while it streams.</div>")
    ui["notice"] = gr.HTML(elem_id="chat-notice")
    with gr.Row(elem_id="composer"):
        ui["message"] = gr.Textbox(label="message", show_label=False, placeholder="Message the model… (Enter to send)",
                                   scale=8, elem_id="message", lines=1, max_lines=6,
                                   max_length=settings.max_message_chars)
        ui["send"] = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="send")
        ui["stop"] = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="stop")
        ui["measure_prompt"] = gr.Button(f"Measure ×{min(DEFAULT_REPEATS, settings.max_measure_repeats)}", scale=1,
                                         min_width=70, elem_id="measure-prompt")
    ui["examples"] = gr.Dataset(components=[gr.Textbox(visible=False)], samples=[], label="try asking",
                                visible=False, elem_id="examples", type="values")
    with gr.Accordion("Sampling, structured output, system prompt, export", open=True, elem_id="sampling-acc"):
        ui["system_prompt"] = gr.Textbox("", label="system prompt", lines=1, max_lines=4, elem_id="system-prompt",
                                         placeholder="optional: how the assistant should behave",
                                         max_length=settings.max_message_chars)
        with gr.Row(elem_id="sampling"):
            ui["max_tokens"] = gr.Slider(1, settings.max_new_tokens, value=min(128, settings.max_new_tokens), step=1,
                                         label="max_tokens", info="new tokens per reply", elem_id="max-tokens")
            ui["temperature"] = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature", info="0 = greedy",
                                          elem_id="temperature")
            ui["top_p"] = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top_p", info="nucleus (1 = off)",
                                    elem_id="top-p")
            ui["top_k"] = gr.Number(value=0, label="top_k", precision=0, minimum=0, info="0 = off", elem_id="top-k")
        with gr.Row(elem_id="sampling-2"):
            ui["sample_seed"] = gr.Textbox("", label="seed", placeholder="random", elem_id="sample-seed", max_length=20,
                                           info="blank = random; a number repeats a sampled reply")
            ui["stop_strings"] = gr.Dropdown([], value=[], multiselect=True, allow_custom_value=True, max_choices=4,
                                             label="stop strings", info="type one and press Enter (up to 4)",
                                             elem_id="stop-strings")
        with gr.Row(elem_id="structured-row"):
            ui["structured"] = gr.Dropdown(list(CHOICES), value=OFF, label="structured output", scale=1,
                                           min_width=140, elem_id="structured")
            ui["structured_spec"] = gr.Textbox("", label="schema or regex", lines=1, max_lines=8, scale=3,
                                               placeholder=SPEC_PLACEHOLDER, elem_id="structured-spec",
                                               max_length=settings.max_message_chars)
        ui["token_probs"] = gr.Checkbox(False, label="show token probabilities (hover a token of the reply: its "
                                        "top 5 alternatives)", elem_id="token-probs")
        with gr.Row(elem_id="chat-tools"):
            ui["clear"] = gr.Button("Clear chat", size="sm", elem_id="clear", min_width=80)
            ui["export_json"] = gr.DownloadButton("Export JSON", size="sm", interactive=False, elem_id="export-json")
            ui["export_md"] = gr.DownloadButton("Export Markdown", size="sm", interactive=False, elem_id="export-md")


def _line_chart(spec: live_charts.ChartSpec, visible: bool = True) -> gr.HTML:
    """A time-series chart, empty until the first refresh."""
    return gr.HTML(live_charts.line_chart_html(spec, live_charts.empty_frame(spec)), elem_id=f"chart-{spec.name}",
                   elem_classes=["chart-html", "line-chart"], visible=visible)


def build_chart_column(ui: dict) -> None:
    """The live charts, added to `ui` by name: TTFT per turn, throughput, memory, KV blocks, batch, speculative
    acceptance (shown while speculating), and quality beside the optimizations with its perplexity button."""
    ui["ttft_chart"] = gr.HTML(live_charts.ttft_html([]), elem_id="chart-ttft", elem_classes=["chart-html"])
    ui["throughput"] = _line_chart(live_charts.THROUGHPUT)
    ui["memory_chart"] = gr.HTML(live_charts.memory_html(None, None, ""), elem_id="chart-memory",
                                 elem_classes=["chart-html"])
    ui["kv_blocks"] = _line_chart(live_charts.KV_BLOCKS)
    ui["batch"] = _line_chart(live_charts.BATCH)
    ui["spec_chart"] = _line_chart(live_charts.SPECULATIVE, visible=False)
    ui["features"] = gr.HTML(features_html(None, None, None, None, None), elem_id="chart-features",
                             elem_classes=["chart-html"])
    ui["measure_ppl"] = gr.Button("Measure perplexity", size="sm", elem_id="measure-ppl")


def build_latency_reporter(ui: dict) -> None:
    """The hidden box and button through which the page script reports the wait it measured (Enter -> text)."""
    with gr.Row(visible="hidden", elem_id="latency-row"):
        ui["latency"] = gr.Textbox(elem_id="visible-latency")
        ui["latency_send"] = gr.Button(elem_id="visible-latency-send")


def wire_chat_api(chat: ChatHandlers, ui: dict, session) -> None:
    """`/chat`, `/clear` and `/export` for API clients (gradio_client): plain text and figures, clear errors."""
    with gr.Group(visible=False):
        reply, figures = gr.Textbox(label="reply"), gr.JSON(label="figures")
        as_json, as_markdown = gr.Textbox(label="json"), gr.Textbox(label="markdown")
        status = gr.Textbox(label="status")
        send, clear, export = gr.Button("chat"), gr.Button("clear"), gr.Button("export")
    sampling = [ui["message"], *[ui[name] for name in SAMPLING]]
    # preprocess=False: the handlers parse every raw value (Gradio's own number checks raised on text: a generic error)
    send.click(chat.api_chat, [*sampling, session], [reply, figures], api_name="chat",
               concurrency_limit=chat.settings.max_concurrent_chats, concurrency_id="chat", preprocess=False)
    clear.click(chat.api_clear, [session], [status], api_name="clear", preprocess=False)
    export.click(chat.api_export, [session], [as_json, as_markdown], api_name="export", preprocess=False)


def wire_chat(chat: ChatHandlers, charts: LiveCharts, ui: dict, session) -> None:
    """The chat's events: send (Enter, Send, an example), the chat box's own icons (retry, edit, undo, trash),
    Stop, Clear, the perplexity button and the page's latency report."""
    sampling = [ui[name] for name in CHAT_SETTINGS]
    chat_kwargs = dict(concurrency_limit=chat.settings.max_concurrent_chats, concurrency_id="chat",
                       show_progress="hidden", **PRIVATE)
    outputs = [ui[name] for name in CHAT_OUTPUTS]
    # always_last: a message sent while the previous event is still closing runs after it instead of being
    # dropped (gradio's default for submit ignores it).
    sent = gr.on([ui["message"].submit, ui["send"].click], chat.send, [ui["message"], *sampling, session], outputs,
                 trigger_mode="always_last", **chat_kwargs)
    example = ui["examples"].click(chat.example, ui["examples"], ui["message"], queue=False, **PRIVATE).then(
        chat.send, [ui["message"], *sampling, session], outputs, **chat_kwargs)
    retried = ui["chatbot"].retry(chat.regenerate, [*sampling, session], outputs, **chat_kwargs)
    edited = ui["chatbot"].edit(chat.edit, [*sampling, session], outputs, **chat_kwargs)
    ui["stop"].click(chat.request_stop, [session], None, queue=False, **PRIVATE).then(
        chat.stopped, [session], outputs, **PRIVATE)
    ui["stop"].click(None, cancels=[sent, example, retried, edited], **PRIVATE)
    ui["chatbot"].undo(chat.undo, [session], outputs, **PRIVATE)
    ui["chatbot"].clear(chat.clear, [session], outputs, **PRIVATE)
    ui["clear"].click(chat.clear, [session], outputs, **PRIVATE)
    ui["measure_ppl"].click(charts.measure_perplexity, [session], ui["features"], concurrency_limit=1,
                            concurrency_id="measure", trigger_mode="always_last", **PRIVATE)
    ui["measure_prompt"].click(chat.measure, [ui["message"], *sampling, session], ui["notice"], concurrency_limit=1,
                               concurrency_id="measure", **PRIVATE)
    ui["latency_send"].click(chat.record_visible_latency, [ui["latency"], session],
                             [ui[name] for name in LATENCY_OUTPUTS], queue=False, show_progress="hidden", **PRIVATE)
