"""The page: engine panel on the left, chat in the middle, live charts on the right.

Only layout and wiring live here; what each event does is in `handlers` and `chat`, chart data in
`charts`. Every control of the engine panel is labelled with its EngineConfig field name, and its
initial value is the default configuration (so the `/apply` API has the panel's defaults). Choices
the engine cannot use here are disabled with the reason (radio buttons greyed out and not
clickable, dropdowns without them), and the reason is in the control's help line. On a narrow
screen the chat comes first and the engine panel starts collapsed.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from engine import CHOICES, unavailable_reason
from playground import charts
from playground.benchmark_tab import TOOLTIPS as BENCHMARK_TOOLTIPS
from playground.benchmark_tab import build_benchmark_tab, wire_benchmark_tab
from playground.chat import CHAT_OUTPUTS, LATENCY_OUTPUTS
from playground.choices import DROPDOWN_CHOICES, RADIO_FIELDS, help_line, page_script_data, usable_choices
from playground.compare_tab import SIDE_INPUTS, build_compare_tab, wire_compare_tab
from playground.compare_tab import TOOLTIPS as COMPARE_TOOLTIPS
from playground.feature_figures import features_html
from playground.figures import header_html
from playground.form import FORM_FIELDS, MIB, config_to_form
from playground.glossary import element_tooltips, glossary_html
from playground.handlers import APPLY_OUTPUTS, PAGE_OUTPUTS, REFRESH_OUTPUTS, Playground
from playground.roofline_tab import OUTPUTS as ROOFLINE_OUTPUTS
from playground.roofline_tab import TOOLTIPS as ROOFLINE_TOOLTIPS
from playground.roofline_tab import build_roofline_tab, wire_roofline_tab

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
JS_PATH = ASSETS / "playground.js"
STORAGE_KEY = "inference-playground-conversation"
THEME = gr.themes.Soft(
    primary_hue="indigo",
    neutral_hue="slate",
    font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
    font_mono=["JetBrains Mono", "ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
)
BLOCK_SIZES = [8, 16, 32, 64, 128, 256]
PLOT_HEIGHT = 170
# Rules for the page around the app, which gradio's scoped custom CSS cannot reach: small phones get the
# whole width.
PAGE_HEAD = """<style>
@media (max-width: 900px) {
  .gradio-container.gradio-container { padding: 4px !important; }
  .gradio-container .main.fillable { padding: 0 !important; }
}
</style>"""


def _radio(field_name: str, value) -> gr.Radio:
    """All choices; the ones that cannot run here are greyed out and blocked by the page's CSS and script."""
    return gr.Radio(CHOICES[field_name], value=value, label=field_name, info=help_line(field_name, value),
                    elem_id=f"ctl-{field_name}", elem_classes=["ctl"])


def _dropdown(field_name: str, value) -> gr.Dropdown:
    """Only the usable choices; the rest are named in the help line. One usable choice: not editable."""
    usable = usable_choices(field_name)
    return gr.Dropdown(usable, value=value, label=field_name, info=help_line(field_name, value),
                       interactive=len(usable) > 1, elem_id=f"ctl-{field_name}", elem_classes=["ctl"])


def page_js() -> str:
    """The page's script (assets/playground.js) with this host's choices and every control's tooltip filled in."""
    tooltips = json.dumps(element_tooltips({**COMPARE_TOOLTIPS, **BENCHMARK_TOOLTIPS, **ROOFLINE_TOOLTIPS}))
    return (JS_PATH.read_text(encoding="utf-8").replace("__CHOICES__", page_script_data())
            .replace("__TOOLTIPS__", tooltips))


def _line_plot(spec: charts.ChartSpec, visible: bool = True) -> gr.LinePlot:
    # y_lim starts every axis at 0 (gradio's plots do not include zero by themselves); the colour map fixes
    # each series' colour from the first frame. The block label names the chart before it has data.
    return gr.LinePlot(x=spec.x, y=spec.y, color="series", color_map=spec.series, color_title=" ", label=spec.title,
                       show_label=True,
                       x_title=spec.x_title, y_title=spec.y_title, y_lim=[0, 8 if spec.integer_y else None],
                       y_axis_format="d" if spec.integer_y else "~s", x_lim=[-charts.WINDOW_S, 0],
                       height=PLOT_HEIGHT, elem_id=f"chart-{spec.name}", elem_classes=["chart"], visible=visible)


def _feature_figures() -> dict:
    """Speculative acceptance over time (shown while speculating), and quality beside the optimizations."""
    figures = {"spec_chart": _line_plot(charts.SPECULATIVE, visible=False)}
    figures["features"] = gr.HTML(features_html(None, None, None, None, None), elem_id="chart-features",
                                  elem_classes=["chart-html"])
    figures["measure_ppl"] = gr.Button("Measure perplexity", size="sm", elem_id="measure-ppl")
    return figures


def _engine_panel(app: Playground) -> dict:
    """The engine panel's controls by form field name, showing the default configuration."""
    settings, form = app.settings, config_to_form(app.default_config, app.curated)
    controls: dict = {}
    controls["model"] = gr.Dropdown(app.model_choices(), value=form["model"], label="model", elem_classes=["ctl"],
                                    elem_id="ctl-model", allow_custom_value=True,
                                    info=app.model_info(form["model"]).get("info"))
    controls["custom_model"] = gr.Textbox(
        value=form["custom_model"], label="model: hub id or local path", elem_id="ctl-custom-model",
        placeholder="e.g. HuggingFaceTB/SmolLM2-135M-Instruct", info="overrides the list when set",
        visible=not settings.curated_only, elem_classes=["ctl"])
    with gr.Accordion("Execution", open=True, elem_classes=["group"]):
        for field_name in ("backend", "device", "dtype", "quantization", "attention"):
            controls[field_name] = _radio(field_name, form[field_name])
    with gr.Accordion("KV cache", open=True, elem_classes=["group"]):
        controls["kv_layout"] = _radio("kv_layout", form["kv_layout"])
        controls["block_size"] = gr.Dropdown(BLOCK_SIZES, value=form["block_size"], label="block_size",
                                             info="tokens per KV block", elem_id="ctl-block_size", elem_classes=["ctl"])
        controls["prefix_caching"] = gr.Checkbox(value=form["prefix_caching"], label="prefix_caching",
                                                 elem_id="ctl-prefix_caching", elem_classes=["ctl"],
                                                 info="reuse KV blocks of a shared prompt prefix (paged only)")
        kv_cap = app.max_kv_cache_bytes // MIB if app.max_kv_cache_bytes else None
        controls["kv_cache_mib"] = gr.Number(
            value=form["kv_cache_mib"], label="kv_cache_bytes (MiB)", minimum=0, maximum=kv_cap,
            info="KV budget; 0 = automatic" + (f" · at most {kv_cap} MiB here" if kv_cap else ""),
            elem_id="ctl-kv_cache_mib", elem_classes=["ctl"])
    with gr.Accordion("Batching", open=True, elem_classes=["group"]):
        controls["batching"] = _radio("batching", form["batching"])
        controls["max_num_seqs"] = gr.Slider(1, settings.max_num_seqs or 256, value=form["max_num_seqs"], step=1,
                                             label="max_num_seqs", info="most sequences in one batch",
                                             elem_id="ctl-max_num_seqs", elem_classes=["ctl"])
        controls["max_num_batched_tokens"] = gr.Number(
            value=form["max_num_batched_tokens"], label="max_num_batched_tokens", precision=0, minimum=1,
            maximum=settings.max_num_batched_tokens, info="token budget of one step (chunked prefill)",
            elem_id="ctl-max_num_batched_tokens", elem_classes=["ctl"])
        controls["max_model_len"] = gr.Number(
            value=form["max_model_len"], label="max_model_len", precision=0, minimum=0, maximum=settings.max_model_len,
            info="context length; 0 = the model's own (up to the engine's default)", elem_id="ctl-max_model_len",
            elem_classes=["ctl"])
        controls["kv_memory_fraction"] = gr.Number(
            value=form["kv_memory_fraction"], label="kv_memory_fraction", minimum=0, maximum=1, step=0.05,
            info="share of the memory available at load for an automatic KV cache; 0 = the device's default",
            elem_id="ctl-kv_memory_fraction", elem_classes=["ctl"])
    with gr.Accordion("Speculative decoding", open=False, elem_classes=["group"]):
        controls["speculative"] = _radio("speculative", form["speculative"])
        spec_on = form["speculative"] != "off"
        controls["draft_model"] = gr.Dropdown(
            [("(the model's curated draft)", "")] + [(n, n) for n in app.models], value=form["draft_model"],
            label="draft_model", elem_id="ctl-draft_model", elem_classes=["ctl"], allow_custom_value=True,
            interactive=form["speculative"] == "draft", info="the small model that proposes (draft mode only)")
        controls["num_speculative_tokens"] = gr.Slider(
            1, 8, value=form["num_speculative_tokens"], step=1, label="num_speculative_tokens", interactive=spec_on,
            info="tokens proposed per step (only while speculative decoding is on)",
            elem_id="ctl-num_speculative_tokens", elem_classes=["ctl"])
    with gr.Accordion("Attention heads, parallelism, advanced", open=False, elem_classes=["group"]):
        controls["gqa"] = _dropdown("gqa", form["gqa"])
        controls["tensor_parallel_size"] = _dropdown("tensor_parallel_size", form["tensor_parallel_size"])
        controls["seed"] = gr.Number(value=form["seed"], label="seed", precision=0, minimum=0,
                                     info="the engine's seed (requests without their own seed)",
                                     elem_id="ctl-seed", elem_classes=["ctl"])
        no_cuda = unavailable_reason("device", "cuda")
        controls["cuda_graphs"] = gr.Checkbox(value=form["cuda_graphs"], label="cuda_graphs", interactive=not no_cuda,
                                              info="capture decode steps as CUDA graphs"
                                                   + (f" · disabled: {no_cuda}" if no_cuda else ""),
                                              elem_id="ctl-cuda_graphs", elem_classes=["ctl"])
        controls["cpu_kernels"] = gr.Checkbox(value=form["cpu_kernels"], label="cpu_kernels",
                                              info="the engine's C++ CPU kernels (pure PyTorch when off or not built)",
                                              elem_id="ctl-cpu_kernels", elem_classes=["ctl"])
    return controls


def _chat_column(app: Playground) -> dict:
    """The chat box, its composer, example questions, sampling controls and exports, by name."""
    settings, ui = app.settings, {}
    ui["chatbot"] = gr.Chatbot(
        label="chat", show_label=False, height="calc(100vh - 420px)", min_height=360, elem_id="chat",
        buttons=["copy"], editable="user", feedback_options=None, sanitize_html=True, layout="bubble",
        placeholder="<div class='empty'><b>Chat with the engine.</b><br>Each reply carries its own figures: the "
                    "engine's TTFT and your wait from Enter to the first text, decode speed and token counts. The "
                    "charts move while it streams.</div>")
    ui["notice"] = gr.HTML(elem_id="chat-notice")
    with gr.Row(elem_id="composer"):
        ui["message"] = gr.Textbox(show_label=False, placeholder="Message the model… (Enter to send)", scale=8,
                                   elem_id="message", lines=1, max_lines=6, max_length=settings.max_message_chars)
        ui["send"] = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="send")
        ui["stop"] = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="stop")
    ui["examples"] = gr.Dataset(components=[gr.Textbox(visible=False)], samples=[], label="try asking",
                                visible=False, elem_id="examples", type="values")
    with gr.Accordion("Sampling, system prompt, export", open=True, elem_id="sampling-acc"):
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
        with gr.Row(elem_id="chat-tools"):
            ui["clear"] = gr.Button("Clear chat", size="sm", elem_id="clear", min_width=80)
            ui["export_json"] = gr.DownloadButton("Export JSON", size="sm", interactive=False, elem_id="export-json")
            ui["export_md"] = gr.DownloadButton("Export Markdown", size="sm", interactive=False, elem_id="export-md")
    return ui


def _api_endpoints(app: Playground, ui: dict, form: list, extras, session) -> None:
    """Endpoints for API clients (gradio_client): plain text and figures, clear errors, no page markup."""
    with gr.Group(visible=False):
        status, config, engine = gr.Textbox(label="status"), gr.JSON(label="config"), gr.JSON(label="engine")
        reply, figures = gr.Textbox(label="reply"), gr.JSON(label="figures")
        as_json, as_markdown = gr.Textbox(label="json"), gr.Textbox(label="markdown")
        buttons = {name: gr.Button(name) for name in ("apply", "apply_preset", "chat", "clear", "export")}
    sampling = [ui[name] for name in ("message", "system_prompt", "max_tokens", "temperature", "top_p", "top_k",
                                      "sample_seed", "stop_strings")]
    buttons["apply"].click(app.api_apply, [*form, extras, session], [status, config, engine], api_name="apply",
                           concurrency_limit=1, concurrency_id="engine-load")
    buttons["apply_preset"].click(app.api_apply_preset, [ui["preset"], session], [status, config, engine],
                                  api_name="apply_preset", concurrency_limit=1, concurrency_id="engine-load")
    buttons["chat"].click(app.chat.api_chat, [*sampling, session], [reply, figures], api_name="chat",
                          concurrency_limit=app.settings.max_concurrent_chats, concurrency_id="chat")
    buttons["clear"].click(app.chat.api_clear, [session], [status], api_name="clear")
    buttons["export"].click(app.chat.api_export, [session], [as_json, as_markdown], api_name="export")


def build_app(app: Playground) -> gr.Blocks:
    """The Gradio Blocks of the playground, wired to `app`'s handlers."""
    private = {"api_visibility": "private"}
    with gr.Blocks(title="Inference Playground", fill_width=True, delete_cache=(3600, 3600)) as demo:
        ui: dict = {"session": gr.State(app.new_session()), "stored": gr.BrowserState(None, storage_key=STORAGE_KEY)}
        extras = gr.State({})
        ui["header"] = gr.HTML(header_html(app.device, app.default_config, None, None), elem_id="header")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=3, min_width=300, elem_id="engine-panel"):
                with gr.Accordion("Engine", open=True, elem_id="engine-acc"):
                    ui["preset"] = gr.Dropdown(app.presets, value=None, label="optimization preset",
                                               info="applied as written: its fields, every other field at its "
                                                    "default (the model stays)", elem_id="preset", elem_classes=["ctl"])
                    ui.update(_engine_panel(app))
                    ui["pool"] = gr.HTML(elem_id="pool")
                with gr.Column(elem_id="apply-bar"):  # outside the accordion, so it sticks to the panel's bottom
                    ui["check"] = gr.HTML(elem_id="check")
                    ui["apply"] = gr.Button("Apply", variant="primary", elem_id="apply")
                    ui["status"] = gr.HTML(elem_id="apply-status")
            with gr.Column(scale=9, min_width=400, elem_id="tabs-col"), gr.Tabs(elem_id="tabs"):
                with gr.Tab("Chat", id="chat", elem_id="tab-chat"), gr.Row(equal_height=False, elem_id="chat-row"):
                    with gr.Column(scale=5, min_width=400, elem_id="chat-col"):
                        ui.update(_chat_column(app))
                    with gr.Column(scale=4, min_width=320, elem_id="charts-col"):
                        ui["ttft_chart"] = gr.HTML(charts.ttft_html([]), elem_id="chart-ttft",
                                                   elem_classes=["chart-html"])
                        ui["throughput"] = _line_plot(charts.THROUGHPUT)
                        ui["memory_chart"] = gr.HTML(charts.memory_html(None, None, ""), elem_id="chart-memory",
                                                     elem_classes=["chart-html"])
                        ui["kv_blocks"] = _line_plot(charts.KV_BLOCKS)
                        ui["batch"] = _line_plot(charts.BATCH)
                        ui.update(_feature_figures())
                with gr.Tab("Compare", id="compare", elem_id="tab-compare") as compare_tab:
                    compare = build_compare_tab(app, ui)
                with gr.Tab("Benchmark", id="benchmark", elem_id="tab-benchmark"):
                    benchmark = build_benchmark_tab(app, ui)
                with gr.Tab("Roofline", id="roofline", elem_id="tab-roofline") as roofline_tab:
                    roofline = build_roofline_tab(app, ui)
                # one tab per job; a further tab slots in here as one more `with gr.Tab(...)`
                with gr.Tab("Glossary", id="glossary", elem_id="tab-glossary"):
                    gr.HTML(glossary_html())
        with gr.Row(visible="hidden", elem_id="latency-row"):
            latency = gr.Textbox(elem_id="visible-latency")
            latency_send = gr.Button(elem_id="visible-latency-send")
        timer = gr.Timer(2.0)

        session, form = ui["session"], [ui[name] for name in FORM_FIELDS]

        def out(names):
            return [ui[name] for name in names]

        _api_endpoints(app, ui, form, extras, session)  # first, so that they keep their names
        wire_compare_tab(compare, ui, form, extras, session)
        compare_tab.select(compare.describe, [ui[name] for name in SIDE_INPUTS] + form + [extras, session],
                           [ui["cmp_a_resolved"], ui["cmp_b_resolved"], ui["cmp_baseline_resolved"]], queue=False,
                           show_progress="hidden", **private)
        wire_benchmark_tab(benchmark, ui, session)
        wire_roofline_tab(roofline, ui, session)
        roofline_tab.select(roofline.show, [ui["rl_window"], ui["rl_probe_started"], session],
                            [ui[name] for name in ROOFLINE_OUTPUTS], queue=False, show_progress="hidden", **private)

        demo.load(app.page_load, [session, ui["stored"]], out(PAGE_OUTPUTS), queue=False, **private)
        for control in form:
            control.input(app.check, [*form, extras, session], [ui["check"], ui["apply"]], queue=False,
                          show_progress="hidden", **private)
        ui["speculative"].change(app.dependent_fields, ui["speculative"], [ui["draft_model"],
                                 ui["num_speculative_tokens"]], queue=False, show_progress="hidden", **private)
        ui["model"].change(app.model_info, ui["model"], ui["model"], queue=False, show_progress="hidden", **private)
        for field_name in (*RADIO_FIELDS, *DROPDOWN_CHOICES):  # the help line follows the selected choice's note
            ui[field_name].change(app.choice_help(field_name), ui[field_name], ui[field_name], queue=False,
                                  show_progress="hidden", **private)
        load_kwargs = dict(concurrency_limit=1, concurrency_id="engine-load", show_progress="hidden", **private)
        ui["apply"].click(app.apply, [*form, extras, session], out(APPLY_OUTPUTS), **load_kwargs)
        ui["preset"].select(app.preset, [ui["preset"], session], out(APPLY_OUTPUTS), **load_kwargs)

        sampling = [ui[name] for name in ("system_prompt", "max_tokens", "temperature", "top_p", "top_k",
                                          "sample_seed", "stop_strings")]
        chat_kwargs = dict(concurrency_limit=app.settings.max_concurrent_chats, concurrency_id="chat",
                           show_progress="hidden", **private)
        chat_outputs = out(CHAT_OUTPUTS)
        # always_last: a message sent while the previous event is still closing runs after it instead of being
        # dropped (gradio's default for submit ignores it).
        sent = gr.on([ui["message"].submit, ui["send"].click], app.chat.send, [ui["message"], *sampling, session],
                     chat_outputs, trigger_mode="always_last", **chat_kwargs)
        example = ui["examples"].click(app.chat.example, ui["examples"], ui["message"], queue=False, **private).then(
            app.chat.send, [ui["message"], *sampling, session], chat_outputs, **chat_kwargs)
        retried = ui["chatbot"].retry(app.chat.regenerate, [*sampling, session], chat_outputs, **chat_kwargs)
        edited = ui["chatbot"].edit(app.chat.edit, [*sampling, session], chat_outputs, **chat_kwargs)
        ui["stop"].click(app.chat.request_stop, [session], None, queue=False, **private).then(
            app.chat.stopped, [session], chat_outputs, **private)
        ui["stop"].click(None, cancels=[sent, example, retried, edited], **private)
        ui["chatbot"].undo(app.chat.undo, [session], chat_outputs, **private)
        ui["chatbot"].clear(app.chat.clear, [session], chat_outputs, **private)
        ui["clear"].click(app.chat.clear, [session], chat_outputs, **private)
        ui["measure_ppl"].click(app.measure_perplexity, [session], ui["features"], concurrency_limit=1,
                                concurrency_id="measure", **private)
        latency_send.click(app.chat.record_visible_latency, [latency, session], out(LATENCY_OUTPUTS), queue=False,
                           show_progress="hidden", **private)
        # Ticks bypass the queue, so open tabs never fill PLAYGROUND_MAX_QUEUE with chart refreshes.
        timer.tick(app.refresh, [session], out(REFRESH_OUTPUTS), show_progress="hidden", queue=False, **private)
    return demo
