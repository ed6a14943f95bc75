"""Putting the playground together with the real engine and launching it.

Why separate from `layout`: tests build the same app on a free port, and a Space imports it;
both need the same pool sizing, queue bounds and styling as `python app.py`.
"""

from __future__ import annotations

import threading

import gradio as gr
import psutil
import torch

from engine import Engine, EngineConfig, describe_device, list_models
from playground.handlers import Playground, config_key, engine_size_bytes
from playground.layout import CSS_PATH, THEME, build_app
from playground.pool import EnginePool
from playground.settings import Settings

GIB = 1024**3


def default_memory_budget() -> int:
    """Most of the GPU on a GPU machine; half the RAM on a CPU machine."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory * 0.85)
    return int(psutil.virtual_memory().total * 0.5)


def create_playground(settings: Settings | None = None, default_model: str | None = None) -> Playground:
    """Handlers over a pool of real engines, with limits from the environment.

    The default model is the curated entry marked `default` (the bundled demo model).
    """
    models = list_models()
    settings = settings or Settings.from_env(list(models))
    budget = int(settings.pool_memory_gib * GIB) if settings.pool_memory_gib else default_memory_budget()
    pool = EnginePool(lambda config: Engine(EngineConfig.from_dict(config)), key=config_key,
                      size_of=engine_size_bytes, close=lambda engine: engine.close(),
                      memory_budget_bytes=budget, max_engines=settings.max_engines)
    default_model = default_model or next((name for name, entry in models.items() if entry.default),
                                          next(iter(models), "demo"))
    default_config = EngineConfig(model=default_model).validate().to_dict()
    return Playground(pool, settings, models, describe_device(), default_config)


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


def launch(app: Playground, demo: gr.Blocks | None = None, **launch_kwargs):
    """Queue bounds from the settings, then Gradio's launch (GRADIO_SERVER_NAME/PORT honoured)."""
    demo = demo or build_app(app)
    demo.queue(max_size=app.settings.max_queue, default_concurrency_limit=app.settings.max_concurrent_chats)
    return demo.launch(theme=THEME, css_paths=[CSS_PATH], **launch_kwargs)
