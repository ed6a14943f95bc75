"""The running playground through its Gradio API (gradio_client), and its handlers under hostile input.

The app runs in-process on a free port of 127.0.0.1 with the real engine pool (see tests/support/ui_helpers.py);
the handlers called directly are the page's own, composed over the same context (`playground/page.py`).
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request

import gradio as gr
import pytest

from playground.app import create_playground, warm_up
from playground.chat.handlers import CHAT_OUTPUTS
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from playground.engine_panel.handlers import PanelHandlers
from playground.figures.configuration import config_tag
from playground.page import PageHandlers
from playground.shared.settings import Settings
from tests.support.ui_helpers import api_client, app_process, serving

# The chat settings with structured output off and no token probabilities.
NO_STRUCTURE = ("off", "", False)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=8, max_prompt_tokens=400, max_queue=8,
                                            max_message_chars=2000)) as running:
        yield running


@pytest.fixture(scope="module")
def handlers(running_app) -> PageHandlers:
    return PageHandlers(running_app.app)


def client(running_app):
    return api_client(running_app.url)


def form_values(app, **changes) -> list:
    values = {**config_to_form(app.default_config.to_dict(), app.curated), **changes}
    return [values[name] for name in FORM_FIELDS]


def apply(api, app, **changes):
    return api.predict(*form_values(app, **changes), api_name="/apply")


def loaded_engine(app, config):
    entry = next(e for e in app.pool.entries() if e.key == config)
    return entry.engine


# ----- /apply --------------------------------------------------------------------------------


def test_apply_has_the_panels_defaults_and_returns_the_loaded_configuration(running_app):
    status, config, engine = client(running_app).predict(api_name="/apply")
    assert status.startswith("loaded: ") and "paged KV/16 + prefix cache" in status
    assert {k: config[k] for k in ("kv_layout", "max_num_seqs", "batching", "block_size")} == {
        "kv_layout": "paged", "max_num_seqs": 32, "batching": "continuous", "block_size": 16}
    assert engine["backend"] == "native" and engine["max_model_len"] >= 64


def test_the_engine_apply_loads_reports_exactly_the_panels_values(running_app):
    """Fails if the playground built its usual paged 32-sequence engine whatever the panel said."""
    app, api = running_app.app, client(running_app)
    asked = dict(kv_layout="paged", block_size=8, prefix_caching=False, kv_cache_mib=4, batching="static",
                 max_num_seqs=3, max_num_batched_tokens=96, max_model_len=192, seed=5, kv_cache_dtype="int8")
    _, resolved, _ = apply(api, app, **asked)
    engine = loaded_engine(app, app.validate({**app.default_config.to_dict(),
                                              **{k: v for k, v in asked.items() if k != "kv_cache_mib"},
                                              "kv_cache_bytes": 4 * 2**20}))
    reported = engine.config.to_dict()
    for field in ("kv_layout", "block_size", "prefix_caching", "batching", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len", "seed", "kv_cache_dtype"):
        assert reported[field] == asked[field] == resolved[field], field
    assert engine.info.kv_cache_dtype == "int8"
    stats = engine.stats()
    assert stats.kv_block_size == 8 and 2 * 2**20 < stats.kv_cache_bytes <= 4 * 2**20
    _, resolved, _ = apply(api, app, kv_layout="contiguous", prefix_caching=False, max_num_seqs=2, max_model_len=128)
    engine = loaded_engine(app, app.default_config.replace(kv_layout="contiguous", prefix_caching=False,
                                                           max_num_seqs=2, max_model_len=128))
    assert (engine.config.kv_layout, engine.config.max_num_seqs, engine.config.max_model_len) == ("contiguous", 2, 128)


def test_a_refused_or_failed_configuration_is_a_clear_error_and_the_session_keeps_serving(running_app):
    from gradio_client.exceptions import AppError

    app, api = running_app.app, client(running_app)
    apply(api, app)
    with pytest.raises(AppError, match="prefix_caching"):
        apply(api, app, kv_layout="contiguous", prefix_caching=True)
    with pytest.raises(AppError, match="nonexistent"):
        apply(api, app, custom_model="/nonexistent/model-folder")
    with pytest.raises(AppError, match="whole number"):
        apply(api, app, max_num_seqs=2.5)
    reply, figures = api.predict("Are you still there?", api_name="/chat")
    assert figures["finish_reason"] in ("stop", "length") and figures["output_tokens"] >= 1


def test_apply_preset_applies_it_as_written(running_app):
    api = client(running_app)
    _, sequential, _ = api.predict("hf-sequential", api_name="/apply_preset")
    assert (sequential["backend"], sequential["batching"], sequential["max_num_seqs"]) == ("hf", "static", 1)
    _, static, _ = api.predict("static", api_name="/apply_preset")
    assert (static["backend"], static["batching"], static["max_num_seqs"]) == ("native", "static", 32)


# ----- /chat, /clear, /export ----------------------------------------------------------------


def test_chat_returns_plain_text_with_figures_apart_and_keeps_the_conversation(running_app):
    api = client(running_app)
    question = "What does the KV cache store?"
    text, first = api.predict(question, api_name="/chat")
    assert isinstance(text, str) and "<" not in text and "msg-figures" not in text
    assert first["engine_ttft_ms"] > 0 and first["first_text_ms"] >= first["engine_ttft_ms"] - 1
    assert 1 <= first["output_tokens"] <= 8 and first["finish_reason"] in ("stop", "length")
    _, second = api.predict("And why does paging it help?", api_name="/chat")
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["output_tokens"], "the first turn was not sent"
    as_json, as_markdown = api.predict(api_name="/export")
    exported = json.loads(as_json)
    assert [e["user"] for e in exported["exchanges"]] == [question, "And why does paging it help?"]
    assert exported["exchanges"][0]["figures"]["engine_ttft_ms"] == first["engine_ttft_ms"]
    assert exported["exchanges"][0]["config"] in {config_tag(entry.key) for entry in running_app.app.pool.entries()}
    assert "## Turn 2" in as_markdown and "engine TTFT" in as_markdown
    assert api.predict(api_name="/clear") == "cleared"
    _, again = api.predict(question, api_name="/chat")
    assert again["prompt_tokens"] == first["prompt_tokens"], "clearing did not empty what the model sees"


def test_chat_sampling_controls_take_effect(running_app):
    api = client(running_app)
    question = "Tell me about json."

    def ask(system="", temperature=0.0, top_p=1.0, top_k=0, seed="", stop=()):
        api.predict(api_name="/clear")
        return api.predict(question, system, 8, temperature, top_p, top_k, seed, list(stop), api_name="/chat")

    greedy, plain = ask()
    assert ask(temperature=1.5, seed="7")[0] == ask(temperature=1.5, seed="7")[0], "a seed did not repeat a reply"
    assert ask(temperature=1.5, top_k=1)[0] == greedy, "top_k=1 must pick the most likely token every time"
    assert ask(temperature=1.5, top_p=0.05)[0] == greedy or plain["output_tokens"] < 2
    if len(greedy) > 3:
        stop_at = greedy[2:4]
        stopped, figures = ask(stop=[stop_at])
        assert stop_at not in stopped and figures["finish_reason"] == "stop" and greedy.startswith(stopped)
    _, with_system = ask(system="Answer in one word.")
    assert with_system["prompt_tokens"] > plain["prompt_tokens"], "the system prompt did not reach the model"


def test_history_is_trimmed_to_the_loaded_models_context(running_app):
    """Issue 11 bug 4: on a small context the oldest turns go so the reply keeps its max_tokens, and it says so."""
    app, api = running_app.app, client(running_app)
    questions = ["What does the json module do?", "And the pickle module?", "Which one is faster?"]
    apply(api, app)
    api.predict(questions[0], api_name="/chat")
    _, second = api.predict(questions[1], api_name="/chat")
    api.predict(api_name="/clear")
    # A context the second prompt fits, but without room for its 8-token reply.
    context = second["prompt_tokens"] + 4
    apply(api, app, max_model_len=context)
    _, first = api.predict(questions[0], api_name="/chat")
    assert first["dropped_turns"] == 0
    for turn, question in enumerate(questions[1:], start=1):
        _, figures = api.predict(question, api_name="/chat")
        assert figures["finish_reason"] in ("stop", "length"), figures
        assert figures["dropped_turns"] >= 1, "the history was kept although the reply had no room left"
        assert figures["prompt_tokens"] + 8 <= context or figures["dropped_turns"] == turn


def test_oversized_messages_and_bad_sampling_are_refused_and_not_kept(running_app):
    from gradio_client.exceptions import AppError

    api = client(running_app)
    with pytest.raises(AppError, match="PLAYGROUND_MAX_MESSAGE_CHARS"):
        api.predict("x" * 2001, api_name="/chat")
    with pytest.raises(AppError, match="maximum"):  # the slider's range is the server's cap
        api.predict("hello", "", 9, api_name="/chat")
    with pytest.raises(AppError, match="seed"):
        api.predict("hello", "", 4, 0.0, 1.0, 0, str(2**64), [], api_name="/chat")
    with pytest.raises(AppError, match="stop"):
        api.predict("hello", "", 4, 0.0, 1.0, 0, "", ["a", "b", "c", "d", "e"], api_name="/chat")
    assert json.loads(api.predict(api_name="/export")[0])["exchanges"] == []


# ----- handlers directly ---------------------------------------------------------------------


def test_closing_the_chat_stream_cancels_the_request(running_app, handlers):
    """What Stop does: Gradio closes the chat generator, which cancels the engine request."""
    app = running_app.app
    session = app.new_session()
    replies = handlers.chat.send("Tell me a long story.", "", app.settings.max_new_tokens, 0.0, 1.0, 0, "", [],
                                 *NO_STRUCTURE, session)
    next(replies)  # the question is shown
    next(replies)  # the first streamed text
    replies.close()
    exchange = session.conversation.exchanges[-1]
    assert exchange.finish_reason == "cancelled" and not session.streaming
    with app.pool.lease(session.config) as entry:
        deadline = time.monotonic() + 5
        while entry.engine.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert entry.engine.stats().num_running == 0


def test_a_finished_reply_is_shown_by_one_update_the_last(running_app, handlers):
    """The page reports its measured wait when it first sees a reply's final figures: a second final update,
    computed before that report reached the server, could arrive after the answer to it and hide the wait."""
    app = running_app.app
    session = app.new_session()
    chatbot = CHAT_OUTPUTS.index("chatbot")
    views = [str(update[chatbot]) for update in handlers.chat.send("Hello, who are you?", "",
                                                                   app.settings.max_new_tokens, 0.0, 1.0, 0, "", [],
                                                                   *NO_STRUCTURE, session)
             if not isinstance(update[chatbot], type(gr.skip()))]
    finished = [index for index, view in enumerate(views) if 'class="msg-figures"' in view]
    assert finished == [len(views) - 1], f"{len(views)} views, the finished reply in {finished}"
    assert len(views) >= 2, "the question is shown before the reply"
    (latency_view, _, _) = handlers.chat.record_visible_latency("850", session)
    assert "Enter → text" in str(latency_view) and "850 ms" in str(latency_view)


def test_sessions_with_the_same_configuration_are_batched_together(running_app, handlers):
    app = running_app.app
    sessions = [app.new_session() for _ in range(3)]
    barrier = threading.Barrier(len(sessions))
    started = time.perf_counter()

    def converse(session):
        barrier.wait()
        for _ in handlers.chat.send("Hello, who are you?", "", app.settings.max_new_tokens, 0.0, 1.0, 0, "", [],
                                    *NO_STRUCTURE, session):
            pass

    threads = [threading.Thread(target=converse, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(s.conversation.exchanges[-1].figures["output_tokens"] >= 1 for s in sessions)
    with app.pool.lease(sessions[0].config) as entry:
        steps = entry.engine.step_history(since=started)
    assert max(step.batch_size for step in steps) >= 2, "concurrent chats did not share a batch"


HOSTILE = [None, "", "x" * 5000, -1, 2**70, math.nan, math.inf, [1, 2], {"a": 1}, True, "../../etc/passwd"]


def exhaust(result):
    return list(result) if hasattr(result, "__next__") else [result]


def test_no_handler_raises_on_hostile_input(running_app, handlers):
    """Every endpoint the page uses is reachable over HTTP: none may raise on odd or hostile values."""
    app, panel, chat = running_app.app, handlers.panel, handlers.chat
    good = form_values(app)
    for value in HOSTILE:
        session = app.new_session()
        for index in range(len(good)):
            form = list(good)
            form[index] = value
            check, button = panel.check(*form, {}, session)
            assert "check" in check
            for outputs in exhaust(panel.apply(*form, value, session)):
                assert len(outputs) > 10
        for outputs in exhaust(panel.preset(value, session)):
            assert len(outputs) > 10
        exhaust(panel.check(*good, value, value))
        exhaust(handlers.page_load(value, value))
        exhaust(handlers.refresh(value))
        exhaust(panel.model_info(value))
        exhaust(panel.dependent_fields(value))
        for field_name in ("quantization", "gqa", "tensor_parallel_size", "backend"):
            assert "info" in panel.choice_help(field_name)(value)
        exhaust(chat.record_visible_latency(value, session))
        exhaust(chat.send(value, value, 4, 0.0, 1.0, 0, "", [], *NO_STRUCTURE, session))
        exhaust(chat.send("hi", "", value, value, value, value, value, value, *NO_STRUCTURE, session))
        exhaust(chat.send("hi", "", 4, 0.0, 1.0, 0, "", [], value, value, value, session))
        exhaust(chat.regenerate(value, value, value, value, value, value, value, value, value, value, session))
        edit = gr.EditData(None, {"index": value, "value": value, "previous_value": value})
        exhaust(chat.edit("", 4, 0.0, 1.0, 0, "", [], *NO_STRUCTURE, session, edit))
        exhaust(chat.edit("", 4, 0.0, 1.0, 0, "", [], value, value, value, session, edit))
        exhaust(chat.undo(value))
        exhaust(chat.clear(value))
        exhaust(chat.example(value))
        exhaust(handlers.page_load(app.new_session(), {"format": "inference-playground-conversation/1",
                                                       "exchanges": [{"user": value}]}))


def test_public_mode_caps_memory_fields_and_hides_server_paths(tmp_path, running_app):
    settings = Settings(public=True, allowed_models=None, max_kv_cache_mib=8, max_num_seqs=4, max_new_tokens=8)
    app = create_playground(settings, default_model=running_app.model)
    panel = PanelHandlers(app)
    try:
        session = app.new_session()
        form = {**config_to_form(app.default_config.to_dict(), app.curated), "max_num_seqs": 4}
        for changes, message in (({"kv_cache_mib": 64}, "PLAYGROUND_MAX_KV_CACHE_MIB"),
                                 ({"max_num_seqs": 5}, "PLAYGROUND_MAX_NUM_SEQS"),
                                 ({"kv_cache_mib": 0, "max_model_len": 0}, "KV cache would take")):
            values = {**form, **changes}
            with pytest.raises(gr.Error, match=message):
                panel.api_apply(*[values[f] for f in FORM_FIELDS], {}, session)
        assert app.pool.entries() == [], "a refused configuration was loaded"
        hidden = tmp_path / "secret-server-folder"
        hidden.mkdir()
        values = {**form, "kv_cache_mib": 1, "custom_model": str(hidden)}
        with pytest.raises(gr.Error) as refused:
            panel.api_apply(*[values[f] for f in FORM_FIELDS], {}, session)
        assert "secret-server-folder" in str(refused.value) and str(tmp_path) not in str(refused.value)
    finally:
        app.pool.close()


def test_over_budget_loads_are_refused_before_they_allocate(running_app):
    app = create_playground(Settings(pool_memory_gib=1 / 1024, max_new_tokens=8), default_model=running_app.model)
    try:
        with pytest.raises(gr.Error, match="memory budget"):
            PanelHandlers(app).api_apply(*form_values(app, kv_cache_mib=16, max_model_len=256), {}, app.new_session())
        assert app.pool.entries() == []
    finally:
        app.pool.close()


def test_python_app_py_serves_the_page_and_the_openai_routes():
    with app_process() as url:
        with urllib.request.urlopen(f"{url}/", timeout=10) as response:
            assert "Inference Playground" in response.read().decode()
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            models = json.loads(response.read())
        assert models["object"] == "list" and models["data"][0]["object"] == "model"


def test_the_start_up_check_runs_on_the_default_engine_and_the_header_shows_it(running_app):
    app = running_app.app
    warm_up(app).join(timeout=120)
    assert app.startup.line.startswith("checked at start-up:") and "check reply in" in app.startup.line
    header = PanelHandlers(app).header(app.new_session())
    assert "hdr-check" in header and "CUDA graphs off: no GPU" in header
