"""Putting the playground together with the real engine and launching it.

Why separate from `layout`: tests build the same app on a free port, and a Space imports it;
both need the same pool sizing, memory checks, queue bounds, styling and OpenAI-compatible
routes as `python app.py`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading

import gradio as gr
import psutil
import torch

from engine import Engine, EngineConfig, describe_device, estimate_memory, list_models, list_presets
from playground.choices import page_css
from playground.errors import Refused
from playground.form import MIB
from playground.handlers import Playground, engine_size_bytes
from playground.layout import CSS_PATH, PAGE_HEAD, THEME, build_app, page_js
from playground.openai_api import openai_routes
from playground.pool import EnginePool
from playground.session import config_key
from playground.settings import Settings

GIB = 1024**3


def default_memory_budget() -> int:
    """Most of the GPU on a GPU machine; half the RAM on a CPU machine."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory * 0.85)
    return int(psutil.virtual_memory().total * 0.5)


def memory_estimator(max_kv_cache_bytes: int | None):
    """The pool's estimate of a configuration (weights + KV bytes, before loading), refusing a KV pool over the cap.

    The cap covers the automatic KV size too (kv_cache_bytes unset), which only the estimate knows.
    """

    def estimate(config: dict) -> int:
        memory = estimate_memory(EngineConfig.from_dict(config))
        if max_kv_cache_bytes is not None and memory.kv_cache_bytes > max_kv_cache_bytes:
            raise Refused(f"this configuration's KV cache would take {memory.kv_cache_bytes / MIB:,.0f} MiB, over "
                          f"this server's cap of {max_kv_cache_bytes / MIB:,.0f} MiB (PLAYGROUND_MAX_KV_CACHE_MIB); "
                          "set kv_cache_bytes, or lower max_num_seqs or max_model_len")
        return memory.total_bytes

    return estimate


def create_playground(settings: Settings | None = None, default_model: str | None = None,
                      models: dict | None = None) -> Playground:
    """Handlers over a pool of real engines, with limits from the environment.

    The default model is the curated entry marked `default` (the bundled demo model). In public
    mode the KV cache of one engine is capped (PLAYGROUND_MAX_KV_CACHE_MIB, by default the pool's
    budget shared by PLAYGROUND_MAX_ENGINES engines).
    """
    models = list_models() if models is None else models
    settings = settings or Settings.from_env(list(models))
    budget = int(settings.pool_memory_gib * GIB) if settings.pool_memory_gib else default_memory_budget()
    kv_cap = settings.max_kv_cache_mib * MIB if settings.max_kv_cache_mib else None
    if settings.public and kv_cap is None:
        kv_cap = budget // settings.max_engines
        settings = dataclasses.replace(settings, max_kv_cache_mib=kv_cap // MIB)
    pool = EnginePool(lambda config: Engine(EngineConfig.from_dict(config)), key=config_key,
                      size_of=engine_size_bytes, close=lambda engine: engine.close(),
                      estimate=memory_estimator(kv_cap), memory_budget_bytes=budget,
                      max_engines=settings.max_engines)
    default_model = default_model or next((name for name, entry in models.items() if entry.default),
                                          next(iter(models), "demo"))
    default_config = EngineConfig(model=default_model).validate().to_dict()
    return Playground(pool, settings, models, describe_device(), default_config, list_presets(), kv_cap)


def warm_up(app: Playground) -> threading.Thread:
    """Load the default engine in the background so the first visitor does not wait for it."""

    def load() -> None:
        try:
            with app.pool.lease(app.default_config):
                pass
        except Exception as error:  # the page shows the same error when a chat asks for it
            print(f"[playground] default engine failed to load: {error}")

    thread = threading.Thread(target=load, name="playground-warm-up", daemon=True)
    thread.start()
    return thread


def launch(app: Playground, demo: gr.Blocks | None = None, prevent_thread_lock: bool = False, **launch_kwargs):
    """Queue bounds from the settings, and Gradio's launch (GRADIO_SERVER_NAME/PORT honoured) of a server that
    also has the OpenAI-compatible routes (/v1/...), over the same engine pool. The routes are given to the
    server when it is created: added after it starts, they answered 404 for a moment."""
    for warning in app.settings.warnings:
        print(f"\n[playground] WARNING: {warning}\n", file=sys.stderr, flush=True)
    demo = demo or build_app(app)
    demo.queue(max_size=app.settings.max_queue, default_concurrency_limit=app.settings.max_concurrent_chats)
    result = demo.launch(theme=THEME, css_paths=[CSS_PATH], css=page_css(), js=page_js(), head=PAGE_HEAD,
                         prevent_thread_lock=True, app_kwargs={"routes": openai_routes(app)},
                         **launch_kwargs)
    if not prevent_thread_lock:
        demo.block_thread()
    return result
