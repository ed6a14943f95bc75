"""The composition root: the playground put together from its parts, as `python app.py`, the tests and a
Hugging Face Space start it (`create_playground`, `build_app`, `warm_up`, `launch`).

Why one place: the shared context knows no tab and no tab knows another. This module builds the
context over a pool of real engines (its memory budget, the estimate that refuses a load before it
allocates, the KV cap of public mode), lays the page out (the engine panel, the chat with its live
charts, the other tabs) and wires each part with what it needs from the others (`page.py`), and
launches the server with its queue bounds, styling, page script and the OpenAI-compatible routes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path

import gradio as gr
import psutil
import torch
from starlette.middleware import Middleware

from engine import (
    AddressPolicy,
    AllowedBase,
    EngineConfig,
    describe_device,
    estimate_memory,
    import_serving_modules,
    list_models,
    list_presets,
    open_engine,
    self_check,
)
from playground.api.http_limits import BodyLimits, bounded_protocol
from playground.api.openai import openai_routes
from playground.benchmark.layout import TOOLTIPS as BENCHMARK_TOOLTIPS
from playground.benchmark.layout import build_benchmark_tab, wire_benchmark_tab
from playground.chat.layout import (
    STORAGE_KEY,
    build_chart_column,
    build_chat_column,
    build_latency_reporter,
    wire_chat,
    wire_chat_api,
)
from playground.chat.layout import TOOLTIPS as CHAT_TOOLTIPS
from playground.compare.layout import TOOLTIPS as COMPARE_TOOLTIPS
from playground.compare.layout import build_compare_tab, wire_compare_tab
from playground.engine_panel.choices import page_css, page_script_data
from playground.engine_panel.form import FORM_FIELDS
from playground.engine_panel.layout import TOOLTIPS as PANEL_TOOLTIPS
from playground.engine_panel.layout import build_engine_panel, wire_engine_panel, wire_engine_panel_api
from playground.figures.configuration import header_html
from playground.glossary.layout import build_glossary_tab
from playground.glossary.terms import element_tooltips
from playground.page import PAGE_OUTPUTS, REFRESH_OUTPUTS, PageHandlers
from playground.roofline.layout import TOOLTIPS as ROOFLINE_TOOLTIPS
from playground.roofline.layout import build_roofline_tab, wire_roofline_tab
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.measurement_slot import MeasurementSlot
from playground.shared.pool import EnginePool
from playground.shared.settings import MIB, Settings
from playground.shared.zero_gpu import ZeroGpu, ZeroGpuEngine

GIB = 1024**3
ZERO_GPU_MEMORY = 70 * GIB  # a ZeroGPU call's GPU slice ("large": half an H200)
ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
JS_PATH = ASSETS / "playground.js"
THEME = gr.themes.Soft(
    primary_hue="indigo",
    neutral_hue="slate",
    font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
    font_mono=["JetBrains Mono", "ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
)
# Rules for the page around the app, which gradio's scoped custom CSS cannot reach: small phones get the
# whole width.
PAGE_HEAD = """<style>
@media (max-width: 900px) {
  .gradio-container.gradio-container { padding: 4px !important; }
  .gradio-container .main.fillable { padding: 0 !important; }
}
</style>"""
PRIVATE = {"api_visibility": "private"}

# ----- the context over real engines ----------------------------------------------------------


def default_memory_budget() -> int:
    """Most of the GPU on a GPU machine; half the RAM on a CPU machine."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory * 0.85)
    return int(psutil.virtual_memory().total * 0.5)


def memory_estimator(max_kv_cache_bytes: int | None):
    """The pool's estimate of a configuration (weights + KV bytes, before loading), refusing a KV pool over the cap.

    The cap covers the automatic KV size too (kv_cache_bytes unset), which only the estimate knows.
    """

    def estimate(config: EngineConfig) -> int:
        memory = estimate_memory(config)
        if max_kv_cache_bytes is not None and memory.kv_cache_bytes > max_kv_cache_bytes:
            raise Refused(f"this configuration's KV cache would take {memory.kv_cache_bytes / MIB:,.0f} MiB, over "
                          f"this server's cap of {max_kv_cache_bytes / MIB:,.0f} MiB (PLAYGROUND_MAX_KV_CACHE_MIB); "
                          "set kv_cache_bytes, or lower max_num_seqs or max_model_len")
        return memory.total_bytes

    return estimate


def remote_policy(settings: Settings) -> AddressPolicy:
    """Which servers a served model (backend='remote') may be fetched from: anything on a laptop; on a public server
    only the base URLs of PLAYGROUND_REMOTE_ALLOW, each on public addresses unless written `private=URL`."""
    entries = tuple(AllowedBase(item.removeprefix("private="), item.startswith("private="))
                    for item in settings.remote_allow_list)
    return AddressPolicy(settings.public, entries)


def engine_size_bytes(engine) -> int:
    """What an engine holds while pooled (a ZeroGPU mode engine holds its checkpoint in CPU memory, no KV pool)."""
    if isinstance(engine, ZeroGpuEngine):
        return engine.held_bytes
    stats = engine.stats()
    return stats.weights_bytes + stats.kv_cache_bytes


def engine_factory(settings: Settings, policy: AddressPolicy):
    """How the pool opens a configuration: `open_engine`; in ZeroGPU mode a `ZeroGpuEngine` (its check runs in a GPU
    call, and so does everything after it), except a model served elsewhere, which needs no GPU here."""
    if not settings.zero_gpu:
        return lambda config: open_engine(config, policy)
    gpu = ZeroGpu(settings.zero_gpu_max_seconds)
    return lambda config: open_engine(config, policy) if config.backend == "remote" else ZeroGpuEngine(config, gpu)


def zero_gpu_device(settings: Settings) -> str:
    """The header's device in ZeroGPU mode (describing the GPU here would initialise CUDA outside a call)."""
    return (f"ZeroGPU mode: a GPU slice per reply or measurement (spaces.GPU, at most "
            f"{settings.zero_gpu_max_seconds} s a call), each call rebuilding the engine")


def create_playground(settings: Settings | None = None, default_model: str | None = None,
                      models: dict | None = None) -> PlaygroundContext:
    """The playground's context over a pool of real engines, with limits from the environment.

    The default model is the curated entry marked `default` (the bundled demo model). In public
    mode the KV cache of one engine is capped (PLAYGROUND_MAX_KV_CACHE_MIB, by default the pool's
    budget shared by PLAYGROUND_MAX_ENGINES engines). Every module a load or a request imports is
    imported here, on this thread, before any request can run (`engine.import_serving_modules`).
    """
    import_serving_modules()
    models = list_models() if models is None else models
    settings = settings or Settings.from_env(list(models))
    budget = (int(settings.pool_memory_gib * GIB) if settings.pool_memory_gib
              else ZERO_GPU_MEMORY if settings.zero_gpu else default_memory_budget())
    kv_cap = settings.max_kv_cache_mib * MIB if settings.max_kv_cache_mib else None
    if settings.public and kv_cap is None:
        kv_cap = budget // settings.max_engines
        settings = dataclasses.replace(settings, max_kv_cache_mib=kv_cap // MIB)
    policy = remote_policy(settings)
    pool = EnginePool(engine_factory(settings, policy), size_of=engine_size_bytes,
                      close=lambda engine: engine.close(), estimate=memory_estimator(kv_cap),
                      memory_budget_bytes=budget, max_engines=settings.max_engines)
    default_model = default_model or next((name for name, entry in models.items() if entry.default),
                                          next(iter(models), "demo"))
    device = zero_gpu_device(settings) if settings.zero_gpu else describe_device()
    return PlaygroundContext(pool, settings, models, device, EngineConfig(model=default_model),
                             list_presets(), kv_cap,
                             MeasurementSlot(settings.max_measure_waiting, settings.max_measure_seconds), policy)


def warm_up(context: PlaygroundContext) -> threading.Thread:
    """Load the default engine in the background so the first visitor does not wait for it, and check it: what it
    runs on and one short reply (`engine.self_check`), which the header then shows."""

    def load() -> None:
        try:
            with context.pool.lease(context.default_config) as entry:
                engine = entry.engine
                if isinstance(engine, ZeroGpuEngine):  # its check ran in the GPU call that opened it
                    context.startup.line = f"ZeroGPU mode: {engine.checked.line()} · {engine.last_call.line()}"
                else:
                    context.startup.line = self_check(engine).line()
        except Exception as error:  # the page shows the same error when a chat asks for it
            context.startup.line = f"start-up check failed: {context.describe(error)}"
            print(f"[playground] default engine failed to load: {error}")

    thread = threading.Thread(target=load, name="playground-warm-up", daemon=True)
    thread.start()
    return thread


# ----- the page -------------------------------------------------------------------------------


def page_js(zero_gpu: bool = False) -> str:
    """The page's script (assets/playground.js) with this host's choices (in ZeroGPU mode or not) and every control's
    tooltip filled in."""
    tooltips = element_tooltips({**PANEL_TOOLTIPS, **CHAT_TOOLTIPS, **COMPARE_TOOLTIPS, **BENCHMARK_TOOLTIPS,
                                 **ROOFLINE_TOOLTIPS})
    return (JS_PATH.read_text(encoding="utf-8").replace("__CHOICES__", page_script_data(zero_gpu))
            .replace("__TOOLTIPS__", json.dumps(tooltips)))


def build_app(context: PlaygroundContext) -> gr.Blocks:
    """The Gradio Blocks of the playground: the header, the engine panel on the left, the tabs (the chat with its
    live charts first) on the right, each tab wired to its handlers over `context`."""
    page = PageHandlers(context)
    with gr.Blocks(title="Inference Playground", fill_width=True, delete_cache=(3600, 3600)) as demo:
        ui: dict = {"session": gr.State(context.new_session()),
                    "stored": gr.BrowserState(None, storage_key=STORAGE_KEY)}
        extras = gr.State({})
        ui["header"] = gr.HTML(header_html(context.device, context.default_config, None, None), elem_id="header")
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=3, min_width=300, elem_id="engine-panel"):
                build_engine_panel(page.panel, ui)
            with gr.Column(scale=9, min_width=400, elem_id="tabs-col"), gr.Tabs(elem_id="tabs"):
                with gr.Tab("Chat", id="chat", elem_id="tab-chat"), gr.Row(equal_height=False, elem_id="chat-row"):
                    with gr.Column(scale=5, min_width=400, elem_id="chat-col"):
                        build_chat_column(context.settings, ui)
                    with gr.Column(scale=4, min_width=320, elem_id="charts-col"):
                        build_chart_column(ui)
                with gr.Tab("Compare", id="compare", elem_id="tab-compare") as compare_tab:
                    build_compare_tab(context, ui)
                with gr.Tab("Benchmark", id="benchmark", elem_id="tab-benchmark"):
                    build_benchmark_tab(context.settings, ui)
                with gr.Tab("Roofline", id="roofline", elem_id="tab-roofline") as roofline_tab:
                    build_roofline_tab(ui)
                # one tab per job; a further tab slots in here as one more `with gr.Tab(...)`
                with gr.Tab("Glossary", id="glossary", elem_id="tab-glossary"):
                    build_glossary_tab()
        build_latency_reporter(ui)
        timer = gr.Timer(2.0)

        session, form = ui["session"], [ui[name] for name in FORM_FIELDS]
        wire_engine_panel_api(page.panel, ui, form, extras, session)  # the API endpoints first: they keep their names
        wire_chat_api(page.chat, ui, session)
        wire_compare_tab(page.compare, compare_tab, ui, form, extras, session)
        wire_benchmark_tab(page.benchmark, ui, session)
        wire_roofline_tab(page.roofline, roofline_tab, ui, session)
        demo.load(page.page_load, [session, ui["stored"]], [ui[name] for name in PAGE_OUTPUTS], queue=False,
                  **PRIVATE)
        wire_engine_panel(page.panel, ui, form, extras, session)
        wire_chat(page.chat, page.charts, ui, session)
        # Ticks bypass the queue, so open tabs never fill PLAYGROUND_MAX_QUEUE with chart refreshes.
        timer.tick(page.refresh, [session], [ui[name] for name in REFRESH_OUTPUTS], show_progress="hidden",
                   queue=False, **PRIVATE)
    return demo


def launch(context: PlaygroundContext, demo: gr.Blocks | None = None, prevent_thread_lock: bool = False,
           **launch_kwargs):
    """Queue bounds from the settings, and Gradio's launch (GRADIO_SERVER_NAME/PORT honoured) of a server that
    also has the OpenAI-compatible routes (/v1/...), over the same engine pool, and bounds every request's
    body and the time to send it and its headers (`api/http_limits.py`). The routes are given to the
    server when it is created: added after it starts, they answered 404 for a moment."""
    settings = context.settings
    for warning in settings.warnings:
        print(f"\n[playground] WARNING: {warning}\n", file=sys.stderr, flush=True)
    demo = demo or build_app(context)
    demo.queue(max_size=settings.max_queue, default_concurrency_limit=settings.max_concurrent_chats)
    limits = Middleware(BodyLimits, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    server = {"routes": openai_routes(context), "middleware": [limits]}
    result = demo.launch(theme=THEME, css_paths=[CSS_PATH], css=page_css(settings.zero_gpu),
                         js=page_js(settings.zero_gpu), head=PAGE_HEAD,
                         prevent_thread_lock=True, app_kwargs=server, **launch_kwargs)
    # uvicorn makes each new connection's protocol from its config: from now on, one that times its headers out
    demo.server.config.http_protocol_class = bounded_protocol(settings.header_timeout_s)
    if not prevent_thread_lock:
        demo.block_thread()
    return result
