"""The playground: its engine pool, limits and figures as units, and the running app through its API.

The API tests start the real app in-process on a free port of 127.0.0.1 and drive it with
gradio_client, on the bundled demo model when it is there and otherwise on a tiny random Llama
built in a temporary folder (with a tokenizer and chat template, so the chat path is the real one).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import EngineConfig, RequestMetrics, StepRecord
from playground import charts
from playground.conversation import PromptTooLong, fit_history
from playground.figures import config_summary, decode_tokens_per_second, figures_html, reply_figures
from playground.handlers import FORM_FIELDS, config_to_form, form_to_config
from playground.pool import EnginePool
from playground.settings import Settings

# ----- engine pool ---------------------------------------------------------------------------


class DummyEngine:
    def __init__(self, config):
        if config.get("fail"):
            raise ValueError(f"cannot load {config['name']}")
        self.name = config["name"]
        self.size = config.get("size", 10)
        self.closed = False

    def close(self):
        self.closed = True


def make_pool(**kwargs):
    loads = []

    def factory(config):
        loads.append(config["name"])
        time.sleep(config.get("delay", 0))
        return DummyEngine(config)

    pool = EnginePool(factory, key=lambda c: c["name"], size_of=lambda e: e.size, close=DummyEngine.close, **kwargs)
    return pool, loads


def test_pool_shares_one_engine_per_configuration():
    pool, loads = make_pool()
    with pool.lease({"name": "a"}) as first, pool.lease({"name": "a"}) as second:
        assert first.engine is second.engine
        assert first.users == 2
    assert loads == ["a"]


def test_pool_loads_once_when_many_sessions_ask_at_the_same_time():
    pool, loads = make_pool()
    engines = []

    def ask():
        with pool.lease({"name": "a", "delay": 0.2}) as entry:
            engines.append(entry.engine)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == ["a"] and len({id(e) for e in engines}) == 1


def test_pool_evicts_least_recently_used_idle_engine():
    pool, loads = make_pool(max_engines=2)
    for name in ("a", "b", "a", "c"):
        with pool.lease({"name": name}):
            pass
    assert [e.key for e in pool.entries()] == ["a", "c"]  # b was least recently used


def test_pool_respects_memory_budget():
    pool, _ = make_pool(memory_budget_bytes=25, max_engines=10)
    engines = {}
    for name in ("a", "b", "c"):
        with pool.lease({"name": name}) as entry:
            engines[name] = entry.engine
    assert [e.key for e in pool.entries()] == ["b", "c"]
    assert engines["a"].closed and not engines["b"].closed


def test_pool_never_closes_an_engine_under_a_running_request():
    pool, _ = make_pool(max_engines=1)
    with pool.lease({"name": "a"}) as running:
        with pool.lease({"name": "b"}) as other:
            assert len(pool.entries()) == 2  # over the limit while both are busy
        assert not running.engine.closed and other.engine.closed  # only the idle one could go
    with pool.lease({"name": "c"}):
        pass
    assert running.engine.closed and [e.key for e in pool.entries()] == ["c"]


def test_pool_failed_load_leaves_the_serving_engine_in_place():
    pool, _ = make_pool(max_engines=1)
    with pool.lease({"name": "a"}) as entry:
        serving = entry.engine
    with pytest.raises(ValueError, match="cannot load b"):
        with pool.lease({"name": "b", "fail": True}):
            pass
    assert [e.key for e in pool.entries()] == ["a"] and not serving.closed
    with pool.lease_if_loaded({"name": "zzz"}) as missing:
        assert missing is None


# ----- settings, figures, charts, history ----------------------------------------------------


def test_settings_default_to_curated_models_on_a_space():
    settings = Settings.from_env(["demo", "smollm"], env={"SPACE_ID": "me/playground"})
    assert settings.curated_only and settings.allowed_models == {"demo", "smollm"}
    assert settings.model_refusal("evil/model") and settings.model_refusal("demo") is None
    local = Settings.from_env(["demo"], env={})
    assert local.allowed_models is None and local.model_refusal("any/model") is None


def test_settings_read_limits_from_environment():
    env = {"PLAYGROUND_ALLOWED_MODELS": "curated, org/extra", "PLAYGROUND_MAX_NEW_TOKENS": "64",
           "PLAYGROUND_MAX_PROMPT_TOKENS": "300", "PLAYGROUND_MAX_QUEUE": "5"}
    settings = Settings.from_env(["demo"], env=env)
    assert settings.allowed_models == {"demo", "org/extra"} and not settings.curated_only
    assert (settings.max_new_tokens, settings.max_prompt_tokens, settings.max_queue) == (64, 300, 5)
    assert Settings.from_env(["demo"], env={"PLAYGROUND_ALLOWED_MODELS": "*"}).allowed_models is None
    with pytest.raises(ValueError, match="PLAYGROUND_MAX_QUEUE"):
        Settings.from_env([], env={"PLAYGROUND_MAX_QUEUE": "lots"})


def test_reply_figures_follow_the_metric_definitions():
    metrics = RequestMetrics.from_timestamps(arrival=10.0, token_times=[10.2, 10.3, 10.4, 10.6], prompt_tokens=12,
                                             cached_tokens=8, spec_proposed=10, spec_accepted=7)
    figures = reply_figures(metrics, speculative=True)
    assert figures["ttft_ms"] == pytest.approx(200.0)
    assert figures["decode_tokens_per_s"] == pytest.approx(3 / 0.4, rel=1e-3)
    assert (figures["prompt_tokens"], figures["output_tokens"], figures["cached_tokens"]) == (12, 4, 8)
    assert figures["spec_acceptance"] == 0.7
    assert "spec_acceptance" not in reply_figures(metrics, speculative=False)
    assert decode_tokens_per_second(RequestMetrics(output_tokens=1, ttft=0.1, e2el=0.1)) is None
    html = figures_html(figures, "cancelled")
    assert "TTFT" in html and "200 ms" in html and "stopped" in html


def test_form_round_trips_a_configuration():
    config = EngineConfig(kv_layout="contiguous", prefix_caching=False, block_size=32,
                          kv_cache_bytes=64 * 2**20).to_dict()
    form = config_to_form(config, ["demo"])
    back = form_to_config(form, {})
    assert all(back[k] == config[k] for k in back)
    assert set(form) == set(FORM_FIELDS)
    assert "contiguous KV" in config_summary(config)


def test_throughput_chart_bins_prefill_and_decode_tokens():
    now = 100.0
    steps = [StepRecord(99.5, 0.1, batch_size=2, num_tokens=30, num_decode_tokens=2, num_running=2, kv_blocks_used=4),
             StepRecord(99.7, 0.1, batch_size=3, num_tokens=3, num_decode_tokens=3, num_running=3, kv_blocks_used=5),
             StepRecord(10.0, 0.1, batch_size=9, num_tokens=9, num_decode_tokens=9, num_running=9,
                        kv_blocks_used=9)]  # outside the window
    frame = charts.throughput_frame(steps, now)
    last = frame[frame["time_s"] == 0.0].set_index("phase")["tokens_per_s"]
    assert last["prefill"] == 28 / charts.BIN_S and last["decode"] == 5 / charts.BIN_S
    assert charts.batch_frame(steps, now)["sequences"].max() == 3
    assert charts.ttft_frame([]).dtypes["ttft_ms"].kind == "f"  # typed even when empty


def test_history_drops_oldest_turns_to_fit_the_prompt_limit():
    messages = [{"role": "system", "content": "s"}] + [
        {"role": r, "content": "x" * 10} for r in ("user", "assistant") * 3]

    def count(msgs):
        return sum(len(m["content"]) for m in msgs)

    fitted = fit_history(messages, count, limit=35)
    assert fitted[0]["role"] == "system" and fitted[1]["role"] == "user" and count(fitted) <= 35
    with pytest.raises(PromptTooLong, match="PLAYGROUND_MAX_PROMPT_TOKENS"):
        fit_history([{"role": "user", "content": "x" * 100}], count, limit=10)


# ----- the running app, through its API ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_tiny_model(folder) -> str:
    """A random 2-layer Llama with a small BPE tokenizer and a ChatML template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.training.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["The KV cache keeps keys and values.", "Paged attention uses blocks.",
                                 "Hello! How can I help you today?"] * 10, vocab_size=300)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def pick_model(tmp_path_factory) -> str:
    """The bundled demo model when present, else a tiny random one."""
    from engine.errors import ModelLoadError
    from engine.hub import list_models, resolve_model_path

    if "demo" in list_models():
        try:
            resolve_model_path("demo")
            return "demo"
        except ModelLoadError:
            pass
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))




def start_app(model: str, settings: Settings):
    """The real app (real engine pool) on a free port; returns (playground, demo, url)."""
    from playground.layout import build_app
    from playground.serve import create_playground, launch

    app = create_playground(settings, default_model=model)
    demo = build_app(app)
    port = free_port()
    launch(app, demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return app, demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    model = pick_model(tmp_path_factory)
    app, demo, url = start_app(model, Settings(max_new_tokens=8, max_prompt_tokens=400, max_queue=8))
    yield SimpleNamespace(app=app, url=url, model=model)
    demo.close()
    app.pool.close()


def form_values(app, **changes) -> list:
    values = {**config_to_form(app.default_config, app.curated), **changes}
    return [values[name] for name in FORM_FIELDS]


def apply(client, app, **changes):
    header, status, pool = client.predict(*form_values(app, **changes), api_name="/apply")
    return header, status, pool


def chat(client, text: str, max_tokens: int = 6):
    chatbot, textbox, figures, *chart_values = client.predict(text, max_tokens, 0.0, api_name="/chat")
    return chatbot, figures, chart_values


@pytest.mark.slow
def test_apply_then_chat_returns_reply_and_figures(running_app):
    from gradio_client import Client

    client = Client(running_app.url, verbose=False)
    header, status, pool = apply(client, running_app.app, block_size=8, max_num_seqs=4)
    assert "Loaded in" in status or "Sharing the loaded engine" in status
    assert "paged KV/8" in header and "continuous ×4" in header
    chatbot, figures, chart_values = chat(client, "What does the KV cache store?")
    assert chatbot[-1]["role"] == "assistant" and "msg-figures" in str(chatbot[-1]["content"])
    assert figures["ttft_ms"] > 0 and figures["prompt_tokens"] > 0
    assert 1 <= figures["output_tokens"] <= 6
    assert figures["finish_reason"] in ("stop", "length")
    ttft_chart = chart_values[0]
    assert ttft_chart["data"] and ttft_chart["data"][-1][1] == pytest.approx(figures["ttft_ms"], abs=0.1)

    # A second session with the same configuration shares the engine instead of loading another.
    other = Client(running_app.url, verbose=False)
    _, other_status, _ = apply(other, running_app.app, block_size=8, max_num_seqs=4)
    assert "Sharing the loaded engine" in other_status
    assert len(running_app.app.pool.entries()) == 1


@pytest.mark.slow
def test_bad_configuration_is_refused_and_previous_engine_still_answers(running_app):
    from gradio_client import Client

    client = Client(running_app.url, verbose=False)
    apply(client, running_app.app)
    _, status, _ = apply(client, running_app.app, kv_layout="contiguous", prefix_caching=True)
    assert "Refused" in status and "prefix_caching" in status and "Still serving" in status
    _, status, _ = apply(client, running_app.app, custom_model="/nonexistent/model-folder")
    assert "Load failed" in status and "nonexistent" in status
    cap = running_app.app.settings.max_new_tokens
    _, figures, _ = chat(client, "Are you still there?", max_tokens=cap)
    assert 1 <= figures["output_tokens"] <= cap and "error" not in figures
    with pytest.raises(Exception, match="maximum"):  # PLAYGROUND_MAX_NEW_TOKENS is enforced by the API too
        chat(client, "More please", max_tokens=cap + 100)


@pytest.mark.slow
def test_closing_the_chat_stream_cancels_the_request(running_app):
    """What the Stop button does: Gradio closes the chat generator, which cancels the engine request."""
    app = running_app.app
    session = app.new_session()
    replies = app.chat("Tell me a long story.", app.settings.max_new_tokens, 0.0, session)
    next(replies)  # the user's message is shown
    next(replies)  # the first streamed text
    replies.close()
    assert session.last_figures["finish_reason"] == "cancelled"
    assert "stopped" in session.display[-1]["content"] and not session.streaming
    with app.pool.lease(session.config) as entry:
        deadline = time.monotonic() + 5
        while entry.engine.stats()["num_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert entry.engine.stats()["num_running"] == 0


def test_preset_fills_the_panel_on_top_of_the_session_configuration(running_app):
    app = running_app.app
    session = app.new_session()
    *values, extras, note = app.preset("contiguous-kv", session)
    form = dict(zip(FORM_FIELDS, values, strict=True))
    assert form["kv_layout"] == "contiguous" and form["prefix_caching"] is False
    assert form["custom_model"] == session.config["model"] or form["model"] == session.config["model"]
    assert "contiguous-kv" in note and extras == {}
    app.validate(form_to_config(form, extras))  # a preset is a valid starting point


def test_allowed_models_are_enforced_when_applying():
    from playground.handlers import Playground

    app = Playground(pool=None, settings=Settings(allowed_models=frozenset({"demo"})), models={},
                     device="CPU", default_config=EngineConfig().to_dict())
    app.validate(EngineConfig(model="demo").to_dict())
    with pytest.raises(ValueError, match="not allowed on this server"):
        app.validate(EngineConfig(model="someone/huge-model").to_dict())


@pytest.mark.slow
def test_sessions_with_the_same_configuration_are_batched_together(running_app):
    app = running_app.app
    sessions = [app.new_session() for _ in range(3)]
    barrier = threading.Barrier(len(sessions))
    started = time.perf_counter()

    def converse(session):
        barrier.wait()
        for _ in app.chat("Hello, who are you?", app.settings.max_new_tokens, 0.0, session):
            pass

    threads = [threading.Thread(target=converse, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(s.last_figures["output_tokens"] >= 1 for s in sessions)
    with app.pool.lease(sessions[0].config) as entry:
        steps = entry.engine.step_history(since=started)
    assert max(step.batch_size for step in steps) >= 2, "concurrent chats did not share a batch"


@pytest.mark.slow
def test_python_app_py_serves_on_the_port_from_the_environment():
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                    page = response.read().decode()
                break
            except OSError:
                assert process.poll() is None, "app.py exited"
                assert time.monotonic() < deadline, "app.py did not serve in time"
                time.sleep(0.5)
        assert "Inference Playground" in page
    finally:
        process.terminate()
        process.wait(timeout=30)
