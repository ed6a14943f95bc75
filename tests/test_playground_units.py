"""The playground's parts without a server: pool, hosting settings, input parsing, history fitting, figures, charts."""

from __future__ import annotations

import json
import math
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from engine import EngineConfig, EngineStats, RequestError, RequestMetrics, StepRecord, list_presets, load_preset
from playground import charts
from playground.charts import SessionActivity
from playground.conversation import Conversation, Exchange, PromptTooLong, fit_prompt
from playground.errors import Refused, describe_error, redact_paths
from playground.figures import config_summary, config_tag, figures_html, reply_figures
from playground.form import FORM_FIELDS, config_to_form, enforce_caps, extras_of, parse_form, preset_config
from playground.params import parse_sampling
from playground.pool import EnginePool, OverBudget
from playground.settings import Settings
from tests.support.reference_figures import engine_info

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

    pool = EnginePool(factory, key=lambda c: c["name"], size_of=lambda e: e.size, close=DummyEngine.close,
                      estimate=lambda c: c.get("size", 10), **kwargs)
    return pool, loads


def test_pool_shares_one_engine_per_configuration():
    pool, loads = make_pool()
    with pool.lease({"name": "a"}) as first, pool.lease({"name": "a"}) as second:
        assert first.engine is second.engine and first.users == 2
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
    pool, _ = make_pool(max_engines=2)
    for name in ("a", "b", "a", "c"):
        with pool.lease({"name": name}):
            pass
    assert [e.key for e in pool.entries()] == ["a", "c"]  # b was least recently used


def test_pool_evicts_idle_engines_before_loading_to_make_room():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    engines = {}
    for name in ("a", "b"):
        with pool.lease({"name": name}) as entry:
            engines[name] = entry.engine
    phases = []
    with pool.lease({"name": "c"}, on_phase=phases.append):
        assert engines["a"].closed and not engines["b"].closed  # evicted before c loaded, not after
    assert phases == ["sizing", "loading"] and [e.key for e in pool.entries()] == ["b", "c"]


def test_pool_refuses_an_over_budget_load_before_the_factory_runs():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    with pool.lease({"name": "a"}) as serving:
        with pytest.raises(OverBudget, match="more than this server's engine memory budget"):
            with pool.lease({"name": "huge", "size": 30}):
                pass
        with pytest.raises(OverBudget, match="engines serving requests hold"):  # a is busy: cannot be evicted
            with pool.lease({"name": "b", "size": 20}):
                pass
        assert not serving.engine.closed
    assert loads == ["a"], "the factory ran for a load that could not fit"


def test_pool_reserves_memory_for_loads_in_progress():
    pool, loads = make_pool(memory_budget_bytes=25, max_engines=10)
    errors = []

    def load(name):
        try:
            with pool.lease({"name": name, "size": 15, "delay": 0.3}):
                time.sleep(0.2)
        except OverBudget as error:
            errors.append(error)

    threads = [threading.Thread(target=load, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and len(errors) == 1, "two loads that together exceed the budget both started"


def test_pool_never_closes_an_engine_under_a_running_request():
    pool, _ = make_pool(max_engines=1)
    with pool.lease({"name": "a"}) as running:
        with pool.lease({"name": "b"}) as other:
            assert len(pool.entries()) == 2
        assert not running.engine.closed and other.engine.closed
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


# ----- hosting settings and errors -----------------------------------------------------------


def test_settings_default_to_curated_models_on_a_space():
    settings = Settings.from_env(["demo", "smollm"], env={"SPACE_ID": "me/playground"})
    assert settings.public and settings.curated_only and settings.allowed_models == {"demo", "smollm"}
    assert settings.model_refusal("evil/model") and settings.model_refusal("demo") is None
    assert settings.max_num_seqs == 64 and settings.max_message_chars == 8000
    local = Settings.from_env(["demo"], env={})
    assert not local.public and local.allowed_models is None and local.model_refusal("any/model") is None


def test_binding_beyond_loopback_defaults_to_the_curated_list_and_warns():
    exposed = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": "0.0.0.0"})
    assert exposed.public and exposed.allowed_models == {"demo"}
    assert any("only the curated models" in w for w in exposed.warnings)
    anything = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": "0.0.0.0", "PLAYGROUND_ALLOWED_MODELS": "*"})
    assert anything.allowed_models is None and any("any local folder" in w for w in anything.warnings)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        loopback = Settings.from_env(["demo"], env={"GRADIO_SERVER_NAME": host})
        assert not loopback.public and not loopback.warnings and loopback.allowed_models is None


def test_settings_read_limits_from_environment():
    env = {"PLAYGROUND_ALLOWED_MODELS": "curated, org/extra", "PLAYGROUND_MAX_NEW_TOKENS": "64",
           "PLAYGROUND_MAX_PROMPT_TOKENS": "300", "PLAYGROUND_MAX_QUEUE": "5", "PLAYGROUND_MAX_KV_CACHE_MIB": "64",
           "PLAYGROUND_MAX_MESSAGE_CHARS": "1000"}
    settings = Settings.from_env(["demo"], env=env)
    assert settings.allowed_models == {"demo", "org/extra"} and not settings.curated_only
    assert (settings.max_new_tokens, settings.max_prompt_tokens, settings.max_queue) == (64, 300, 5)
    assert (settings.max_kv_cache_mib, settings.max_message_chars) == (64, 1000)
    with pytest.raises(ValueError, match="PLAYGROUND_MAX_QUEUE"):
        Settings.from_env([], env={"PLAYGROUND_MAX_QUEUE": "lots"})
    with pytest.raises(ValueError, match="PLAYGROUND_POOL_MEMORY_GIB"):
        Settings.from_env([], env={"PLAYGROUND_POOL_MEMORY_GIB": "nan"})


def test_public_errors_do_not_echo_server_paths():
    error = RequestError("cannot read the model config in /srv/secret/models/x: no config.json")
    assert describe_error(error, public=True) == "cannot read the model config in x: no config.json"
    assert "/srv/secret" in describe_error(error, public=False)
    assert describe_error(ValueError("bad /home/me/.cache/a.bin"), public=True) == "ValueError: bad a.bin"
    assert redact_paths("tokens / s, KV/16, https://hf.co/org/name and org/name") == \
        "tokens / s, KV/16, https://hf.co/org/name and org/name"


# ----- the engine panel's values -------------------------------------------------------------


def test_form_round_trips_every_field_of_a_configuration():
    config = EngineConfig(kv_layout="contiguous", prefix_caching=False, block_size=32, kv_cache_bytes=64 * 2**20,
                          max_num_batched_tokens=512, max_model_len=256, seed=7, batching="static").to_dict()
    form = config_to_form(config, ["demo"])
    assert set(form) == set(FORM_FIELDS)
    assert parse_form(form, extras_of(config)) == config


@pytest.mark.parametrize("field,value,message", [
    ("kv_cache_mib", float("nan"), "finite"), ("kv_cache_mib", "lots", "number"), ("kv_cache_mib", -5, "positive"),
    ("max_num_seqs", 2.5, "whole"), ("max_num_seqs", 0, "between"), ("max_num_seqs", [1], "number"),
    ("block_size", None, "number"), ("backend", ["native"], "one of"), ("dtype", "float64", "one of"),
    ("prefix_caching", "yes", "true or false"), ("model", 12, "text"), ("custom_model", "x" * 400, "longer"),
    ("seed", 2**64, "between"), ("gqa", "some", "number"), ("max_model_len", 1, "at least 2"),
])
def test_form_refuses_what_no_control_can_produce(field, value, message):
    form = config_to_form(EngineConfig().to_dict(), ["demo"])
    with pytest.raises(Refused, match=message):
        parse_form({**form, field: value}, {})


def test_preset_is_applied_as_written_not_layered_on_the_panel():
    sequential = preset_config("hf-sequential", "demo", list_presets())
    assert (sequential["backend"], sequential["batching"], sequential["max_num_seqs"]) == ("hf", "static", 1)
    for name in ("static", "paged-kv", "prefix-cache", "no-prefix-cache", "hf-static"):
        after = preset_config(name, "demo", list_presets())
        assert after["max_num_seqs"] == EngineConfig().max_num_seqs, f"{name} kept hf-sequential's max_num_seqs"
        assert after == {**EngineConfig().to_dict(), **load_preset(name), "model": "demo"}
    assert preset_config("static", "smollm2-135m", list_presets())["model"] == "smollm2-135m"


def test_preset_names_only_not_paths():
    for name in ("../presets/static", "/etc/hosts.toml", "presets/static.toml", None, 3):
        with pytest.raises(Refused, match="no preset"):
            preset_config(name, "demo", list_presets())


def test_public_caps_bound_every_memory_sizing_field():
    settings = Settings(public=True, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256)
    ok = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256,
                      kv_cache_bytes=16 * 2**20).to_dict()
    enforce_caps(ok, settings, 16 * 2**20)
    for field, value, variable in (("max_num_seqs", 9, "PLAYGROUND_MAX_NUM_SEQS"),
                                   ("max_num_batched_tokens", 513, "PLAYGROUND_MAX_BATCHED_TOKENS"),
                                   ("max_model_len", 257, "PLAYGROUND_MAX_MODEL_LEN"),
                                   ("kv_cache_bytes", 17 * 2**20, "PLAYGROUND_MAX_KV_CACHE_MIB")):
        with pytest.raises(Refused, match=variable):
            enforce_caps({**ok, field: value}, settings, 16 * 2**20)


# ----- sampling controls ---------------------------------------------------------------------


def test_sampling_values_are_checked_and_capped():
    settings = Settings(max_new_tokens=64)
    params = parse_sampling(settings, 10, 0.7, 0.9, 40, "123", ["\n\n", "User:"])
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.stop) == (
        10, 0.7, 0.9, 40, 123, ("\n\n", "User:"))
    assert parse_sampling(settings, 10, 1e-40).temperature == 0.0  # a tiny temperature is greedy, not an overflow
    assert parse_sampling(settings, 10, seed="").seed is None
    for kwargs, message in ((dict(max_tokens=65), "PLAYGROUND_MAX_NEW_TOKENS"),
                            (dict(temperature=math.nan), "temperature"), (dict(temperature=2.5), "temperature"),
                            (dict(top_p=0), "top_p"), (dict(top_k=-1), "top_k"), (dict(seed=2**64), "seed"),
                            (dict(seed="abc"), "seed"), (dict(stop=["a"] * 5), "at most 4"),
                            (dict(stop=["x" * 65]), "64 characters"), (dict(stop=[3]), "strings")):
        with pytest.raises(Refused, match=message):
            parse_sampling(settings, **{"max_tokens": 10, **kwargs})


# ----- conversations and history fitting -----------------------------------------------------


def word_encoder(calls: list):
    """A stand-in for Engine.encode: one token per word of the rendered chat; raises past 100 tokens."""

    def encode(prompt):
        calls.append(prompt)
        ids = [1] * sum(len(m["content"].split()) + 2 for m in prompt)
        if len(ids) >= 100:
            raise RequestError(f"the prompt is {len(ids)} tokens but max_model_len is 100")
        return ids

    return encode


def test_history_is_trimmed_to_the_loaded_engines_context_minus_the_reply_budget():
    pairs = [(f"question {i} " + "word " * 8, f"answer {i} " + "word " * 8) for i in range(12)]
    calls = []
    fitted = fit_prompt(word_encoder(calls), True, "be brief", pairs, "the newest question", max_model_len=100,
                        max_tokens=40, max_prompt_tokens=4096)
    # 2 pairs of 24 tokens + system 4 + question 5 = 57 <= 100 - 40; 3 pairs would be 81
    assert fitted.dropped_turns == 10 and len(fitted.token_ids) == 57 and fitted.reply_room == 43
    assert len(calls) <= 5, "fitting should take O(log turns) encodings"
    chosen = next(c for c in calls if len(c) == 2 + 2 * 2)
    assert chosen[0]["content"] == "be brief" and chosen[1]["content"].startswith("question 10")
    assert chosen[-1]["content"] == "the newest question"


def test_the_newest_turn_is_kept_even_when_it_leaves_less_room_than_max_tokens():
    fitted = fit_prompt(word_encoder([]), True, "", [("old " * 10, "reply " * 10)], "new " * 50,
                        max_model_len=100, max_tokens=80, max_prompt_tokens=4096)
    assert fitted.dropped_turns == 1 and len(fitted.token_ids) == 52 and fitted.reply_room == 48
    with pytest.raises(PromptTooLong, match="PLAYGROUND_MAX_PROMPT_TOKENS"):
        fit_prompt(word_encoder([]), True, "", [], "new " * 50, max_model_len=100, max_tokens=8, max_prompt_tokens=30)
    with pytest.raises(RequestError, match="max_model_len"):
        fit_prompt(word_encoder([]), True, "", [], "new " * 120, max_model_len=100, max_tokens=8,
                   max_prompt_tokens=4096)


def test_conversation_exports_and_restores_only_well_formed_copies():
    figures = reply_figures(RequestMetrics.from_timestamps(10.0, [10.2, 10.3], 12, 8), speculative=False)
    conversation = Conversation("be brief", [Exchange("hi", "hello", figures, "stop", visible_ttft_ms=900.0,
                                                      config="demo · native"), Exchange("still streaming")])
    data = json.loads(conversation.to_json())
    assert len(data["exchanges"]) == 1  # an unfinished reply is not exported
    restored = Conversation.from_dict(data, max_message_chars=100)
    assert restored.exchanges[0].reply == "hello" and restored.history_pairs() == [("hi", "hello")]
    markdown = conversation.to_markdown()
    assert "engine TTFT 200 ms" in markdown and "Enter → first text 900 ms" in markdown and "be brief" in markdown
    for broken in ({"format": "x"}, {**data, "exchanges": "no"},
                   {**data, "exchanges": [{**data["exchanges"][0], "user": "x" * 101}]},
                   {**data, "exchanges": [{**data["exchanges"][0], "finish_reason": "exploded"}]},
                   {**data, "exchanges": [{**data["exchanges"][0], "figures": {"engine_ttft_ms": "fast"}}]}):
        with pytest.raises(Refused):
            Conversation.from_dict(broken, max_message_chars=100)


def test_failed_and_empty_replies_are_not_history():
    conversation = Conversation("", [Exchange("a", "x", finish_reason="stop"),
                                     Exchange("b", "y", finish_reason="error"),
                                     Exchange("c", "", finish_reason="cancelled")])
    assert conversation.history_pairs() == [("a", "x")]


# ----- figures and charts --------------------------------------------------------------------


def test_reply_figures_follow_the_metric_definitions():
    metrics = RequestMetrics.from_timestamps(arrival=10.0, token_times=[10.2, 10.3, 10.4, 10.6], prompt_tokens=12,
                                             cached_tokens=8, spec_proposed=10, spec_accepted=7)
    figures = reply_figures(metrics, speculative=True)
    assert figures["engine_ttft_ms"] == pytest.approx(200.0)
    assert figures["decode_tokens_per_s"] == pytest.approx(3 / 0.4, rel=1e-3)
    assert (figures["prompt_tokens"], figures["output_tokens"], figures["cached_tokens"]) == (12, 4, 8)
    assert figures["spec_acceptance"] == 0.7
    chips = figures_html({**figures, "visible_ttft_ms": 850.0}, "cancelled", dropped_turns=2)
    assert "engine TTFT" in chips and "200 ms" in chips and "Enter → text" in chips and "850 ms" in chips
    assert "stopped" in chips and "2 older turns left out" in chips and "8 cached" in chips


def test_configuration_summaries_say_what_each_backend_really_does():
    native = EngineConfig().to_dict()
    assert "paged KV/16 + prefix cache" in config_summary(native, engine_info(attention="sdpa"))
    hf_static = EngineConfig(backend="hf", batching="static", max_num_seqs=1).to_dict()
    summary = config_summary(hf_static, engine_info(backend="hf", attention="transformers sdpa"))
    assert "paged" not in summary and "prefix" not in summary and "generate static ×1" in summary
    assert "hf backend" in summary and "attention transformers sdpa" in summary
    hf_continuous = EngineConfig(backend="hf").to_dict()
    assert "transformers paged KV/16 + block sharing" in config_summary(hf_continuous, engine_info(backend="hf"))
    assert config_tag(hf_static) == "demo · hf · generate static ×1"


def test_engine_wide_charts_draw_this_sessions_requests_apart():
    now = 100.0
    steps = [StepRecord(99.5, 0.1, batch_size=2, num_tokens=30, num_decode_tokens=2, num_running=2, kv_blocks_used=4),
             StepRecord(99.7, 0.1, batch_size=3, num_tokens=3, num_decode_tokens=3, num_running=3, kv_blocks_used=5),
             StepRecord(10.0, 0.1, batch_size=9, num_tokens=9, num_decode_tokens=9, num_running=9,
                        kv_blocks_used=9)]  # outside the window
    activity = SessionActivity()
    activity.request_started(99.2)
    activity.tokens_arrived(99.6, 2)
    frame = charts.throughput_frame(steps, activity, now)
    last = frame[frame["time_s"] == 0.0].set_index("series")["tokens_per_s"]
    assert last["prefill (all)"] == 28 and last["decode (all)"] == 5 and last["this session"] == 2
    batch = charts.batch_frame(steps, activity, now)
    latest = batch[batch["time_s"] == 0.0].set_index("series")["sequences"]
    assert latest["running (all)"] == 3 and latest["this session"] == 1
    assert batch[batch["series"] == "this session"]["sequences"].sum() == 1  # the request began in the last bin
    assert charts.axis_top(batch["sequences"], integer=True) == 8
    assert charts.axis_top(pd.Series([3.0, 12.2]), integer=True) == 13
    assert charts.axis_top(pd.Series([0.0, 0.0]), integer=False) == 1.0  # never an empty range
    assert "all sessions on this engine" in charts.THROUGHPUT.title


def test_memory_chart_shows_each_figure_of_this_engine_and_the_process_apart():
    stats = EngineStats(weights_bytes=26 * 2**20, kv_cache_bytes=384 * 2**20, kv_cache_used_bytes=96 * 2**10,
                        kv_blocks_total=2048, kv_blocks_free=2047, peak_memory_bytes=900 * 2**20)
    shown = charts.memory_html(stats, 850 * 2**20, "demo · native")
    assert "26.0 MiB" in shown and "384.0 MiB" in shown and "96.0 KiB" in shown and "1 of 2048 blocks" in shown
    assert "width:1.00%" in shown, "a few KV blocks in use must still draw a visible bar"
    assert "process (every engine in the pool + the app): peak 900.0 MiB" in shown


def test_ttft_chart_labels_each_bar_with_its_configuration_and_prompt():
    rows = [{"number": 1, "config": "demo · native · paged/16+prefix · continuous ×32", "engine_ttft_ms": 40.0,
             "first_text_ms": 55.0, "visible_ttft_ms": 300.0, "prompt_tokens": 412, "cached_tokens": 380}]
    shown = charts.ttft_html(rows)
    assert "paged/16+prefix" in shown and "prompt 412 tok (380 cached)" in shown
    assert "40 ms engine" in shown and "300 ms to text" in shown


def test_hub_models_are_told_apart_by_whether_the_local_cache_holds_them(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from playground.loading import availability_note, hub_cache_bytes, hub_cache_state, hub_repo

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "blobs").mkdir()
    (repo / "blobs" / "weights.incomplete").write_bytes(b"x" * 1000)
    assert hub_cache_state("org/cached") == "partial" and hub_cache_bytes("org/cached") == 1000
    (snapshot / "model.safetensors").write_bytes(b"")
    assert hub_cache_state("org/cached") == "cached" and hub_cache_state("org/absent") == "missing"
    models = {"bundled": SimpleNamespace(source="assets/models/demo-chat"),
              "absent": SimpleNamespace(source="org/absent")}
    assert hub_repo("bundled", models) is None and hub_repo("absent", models) == "org/absent"
    assert "no network needed" in availability_note("org/cached", {})
    assert "needs the network" in availability_note("absent", models)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "cannot load" in availability_note("absent", models)
