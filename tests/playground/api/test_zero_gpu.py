"""ZeroGPU mode (docs/hosting.md, "ZeroGPU"), on a CPU: the app started with the mode forced and the `spaces` stand-in
of tests/support/fake_spaces, which forks each call, pickles its arguments and results, records its duration and
fails (recorded) on CUDA or an engine built outside a call; and the real `spaces` package, off ZeroGPU."""

from __future__ import annotations

import json
import os
import sys

import pytest
from gradio_client.exceptions import AppError

from engine import EngineConfig, RequestError, SamplingParams, list_models
from playground.app import create_playground, warm_up
from playground.engine_panel.choices import help_line, unavailable_choices
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from playground.page import REFRESH_OUTPUTS, PageHandlers
from playground.shared import zero_gpu
from playground.shared.errors import Refused
from playground.shared.settings import Settings
from tests.support.paths import PROJECT_ROOT
from tests.support.ui_helpers import api_client, app_process

FAKE_SPACES = PROJECT_ROOT / "tests" / "support" / "fake_spaces"

pytestmark = pytest.mark.slow


def calls(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def form(**changes) -> list:
    values = {**config_to_form(EngineConfig(model="demo").to_dict(), list(list_models())), **changes}
    return [values[name] for name in FORM_FIELDS]


def test_the_app_chats_compares_and_benchmarks_with_every_engine_inside_a_gpu_call(tmp_path):
    record = tmp_path / "calls.jsonl"
    env = {"PLAYGROUND_ZEROGPU": "1", "FAKE_SPACES_RECORD": str(record),
           "PYTHONPATH": os.pathsep.join([str(FAKE_SPACES), str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    with app_process(env, timeout=180) as url:
        api = api_client(url)
        short, short_figures = api.predict("Hello", "", 2, 0.0, 1.0, 0, 0, "", api_name="/chat")
        _, long_figures = api.predict("Tell me more", "", 512, 0.0, 1.0, 0, 0, "", api_name="/chat")
        assert long_figures["zerogpu_asked_s"] > short_figures["zerogpu_asked_s"], "the duration ignores the tokens"
        for figures in (short_figures, long_figures):
            assert figures["finish_reason"] in ("stop", "length") and figures["output_tokens"] >= 1
            assert 0 < figures["zerogpu_rebuild_s"] < figures["zerogpu_call_s"] <= figures["zerogpu_asked_s"]

        outcome = api.predict("engine panel", "", "engine panel", "", "What is os.path?", 4, 0.0, 1.0, 0, 0, 1,
                              False, False, api_name="/compare")
        assert outcome["labels"] == ["A", "B"] and not outcome["cancelled"]
        assert all(outcome["sides"][label]["outputs"][0] for label in "AB")

        report, _, _ = api.predict("random", None, 4, 2, 0, "8", "4", 0, True, 0, 0, 0, api_name="/benchmark")
        assert report["completed"] == 4 and report["total_output_tokens"] == 16

        with pytest.raises(AppError, match="PLAYGROUND_ZEROGPU_MAX_SECONDS"):  # 65 waves of 512 steps
            api.predict("random", None, 64, 1, 0, "8", "512", 0, True, 0, 0, 0, api_name="/benchmark")
        with pytest.raises(AppError, match="tensor_parallel_size=2: ZeroGPU mode runs each reply in one forked call"):
            api.predict(*form(tensor_parallel_size="2"), api_name="/apply")
        with pytest.raises(AppError, match="disaggregation=prefill-decode: ZeroGPU mode"):
            api.predict(*form(disaggregation="prefill-decode"), api_name="/apply")
    made = calls(record)
    assert not [call for call in made if "violation" in call], "CUDA or an engine outside a spaces.GPU call"
    # the start-up check, two replies, the two sides of the comparison, the benchmark: each one call
    assert [(call["name"], call["first_argument"]) for call in made] == [
        ("in_call", job) for job in ("check_job", "stream_job", "stream_job", "measure_job", "measure_job",
                                     "measure_job")]
    assert all(call["duration"] > 0 for call in made)
    # what spaces.GPU was asked (the dynamic duration, called with the call's own arguments) is what the reply says
    assert [round(call["duration"], 1) for call in made[1:3]] == [short_figures["zerogpu_asked_s"],
                                                                   long_figures["zerogpu_asked_s"]]


def test_the_real_spaces_package_off_zero_gpu_leaves_the_call_in_this_process():
    sys.modules.pop("spaces", None)
    import spaces

    assert "fake_spaces" not in spaces.__file__, "the stand-in was imported instead of the spaces package"
    assert zero_gpu.ZeroGpu(120).call is zero_gpu.in_call  # off ZeroGPU, spaces.GPU returns the function
    context = create_playground(Settings(zero_gpu=True, max_new_tokens=8), default_model="demo")
    try:
        warm_up(context).join(timeout=180)
        assert context.startup.line.startswith("ZeroGPU mode: checked at start-up:"), context.startup.line
        with context.pool.lease(context.default_config) as entry:
            engine = entry.engine
            assert isinstance(engine, zero_gpu.ZeroGpuEngine)
            text = "".join(delta.text for delta in engine.stream(engine.encode("Hi"), SamplingParams(max_tokens=4)))
            assert text and engine.thread_call().load_seconds > 0
            assert 0 < engine.seconds_for(8, "a reply") < engine.seconds_for(512, "a reply"), "tokens asked ignored"
            with pytest.raises(Refused, match="PLAYGROUND_ZEROGPU_MAX_SECONDS"):
                engine.seconds_for(100_000, "a reply")
            stats = engine.stats()
            assert stats.weights_bytes > 0 and stats.kv_blocks_total > 0 and engine.step_history(), \
                "the call's snapshot was not kept"
            with pytest.raises(RequestError, match="OpenAI routes"):
                engine.submit([1, 2, 3])
        # the header, the pool and the live charts draw from the calls' snapshots
        shown = dict(zip(REFRESH_OUTPUTS, PageHandlers(context).refresh(context.new_session()), strict=True))
        assert "ZeroGPU mode:" in shown["header"] and "demo · defaults" in shown["pool"]
        assert f"of {stats.kv_blocks_total} allocated" in shown["kv_blocks"] and "Running sequences" in shown["batch"]
    finally:
        context.pool.close()


def test_what_zero_gpu_mode_cannot_run_is_disabled_with_the_reason_and_refused():
    assert "disabled: prefill-decode (ZeroGPU mode" in help_line("disaggregation", "off", zero_gpu=True)
    assert set(unavailable_choices("tensor_parallel_size", zero_gpu=True)) >= {2, 4, 8}
    assert set(unavailable_choices("pipeline_parallel_size", zero_gpu=True)) >= {2, 4, 8}
    assert "ZeroGPU" not in help_line("disaggregation", "off")
    context = create_playground(Settings(zero_gpu=True))
    fields = EngineConfig(model="demo").to_dict()
    with pytest.raises(Refused, match="pipeline_parallel_size=2: ZeroGPU mode runs each reply in one forked call"):
        context.validate({**fields, "pipeline_parallel_size": 2})
    assert context.validate(fields).model == "demo"
    assert context.device.startswith("ZeroGPU mode:")


def test_the_mode_is_read_as_the_spaces_package_reads_it_or_forced():
    for env, on in (({"SPACES_ZERO_GPU": "true"}, True), ({"SPACES_ZERO_GPU": "t"}, True),
                    ({"SPACES_ZERO_GPU": "0"}, False), ({"PLAYGROUND_ZEROGPU": "1"}, True), ({}, False)):
        assert Settings.from_env(["demo"], env).zero_gpu is on, env
    assert Settings.from_env(["demo"], {"PLAYGROUND_ZEROGPU_MAX_SECONDS": "30"}).zero_gpu_max_seconds == 30


def test_the_mode_without_the_spaces_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # an import of it raises ImportError
    with pytest.raises(RuntimeError, match="needs the spaces package"):
        create_playground(Settings(zero_gpu=True))
