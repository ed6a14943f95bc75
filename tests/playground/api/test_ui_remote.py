"""A model served elsewhere (backend=remote) through the running playground's Gradio API: the panel loads it, the
chat streams from it, Compare sets it against the local engine on the same prompts, and the Benchmark measures it.

The servers are real ones in second processes: llama.cpp's own OpenAI-compatible server (`python -m
llama_cpp.server`, nobody here wrote it) on the demo model's GGUF, and this app's own `/v1` (`python app.py`). The
playground under test runs in-process on the demo model (tests/support/ui_helpers.py).
"""

from __future__ import annotations

import pytest

from engine.host import llama_cpp_available
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from playground.shared.settings import Settings
from tests.support.llama_cpp_server import llama_cpp_server
from tests.support.ui_helpers import api_client, app_process, serving

pytestmark = pytest.mark.slow
PROMPTS = "What does the json module do?\nHow do I read a file line by line?"
LLAMA_CPP = "llama.cpp's server"
THIS_APP = "this app's /v1"


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=64, max_prompt_tokens=400, max_queue=8,
                                            max_message_chars=2000)) as running:
        yield running


@pytest.fixture(scope="module", params=[LLAMA_CPP, THIS_APP])
def server(request) -> str:
    """The /v1 base URL of a server in a second process, serving the demo model as "demo"."""
    if request.param == LLAMA_CPP:
        if not llama_cpp_available():
            pytest.skip("llama-cpp-python is not installed (`make test` installs it)")
        with llama_cpp_server() as base:
            yield base
    else:
        with app_process() as url:
            yield f"{url}/v1"


def remote_fields(server: str) -> dict:
    return {"backend": "remote", "remote_url": server, "remote_model": "demo"}


def apply(api, app, **changes):
    values = {**config_to_form(app.default_config.to_dict(), app.curated), **changes}
    return api.predict(*[values[name] for name in FORM_FIELDS], api_name="/apply")


def test_the_panel_loads_a_served_model_and_the_chat_streams_from_it(running_app, server):
    api = api_client(running_app.url)
    status, config, engine = apply(api, running_app.app, **remote_fields(server))
    assert (config["backend"], config["remote_url"], config["remote_model"]) == ("remote", server, "demo"), status
    assert engine["backend"] == "remote" and engine["device"] == server
    text, figures = api.predict("What does the json module do?", api_name="/chat")
    assert text.strip(), "no reply streamed"
    assert figures["measured_at"] == "client" and figures["engine_ttft_ms"] > 0
    assert figures["output_tokens"] >= 1 and figures["prompt_tokens"] > 5


def test_compare_sets_the_local_engine_against_the_served_model_on_the_same_prompts(running_app, server):
    api = api_client(running_app.url)
    changes = ", ".join(f"{key}={value}" for key, value in remote_fields(server).items())
    outcome = api.predict("engine panel", "", "engine panel", changes, PROMPTS, 8, 0.0, 1.0, 0, 0, 1, False, False,
                          "off", "", "B", api_name="/compare")
    sides = outcome["sides"]
    assert sides["A"]["config"]["backend"] != "remote" and sides["B"]["config"]["backend"] == "remote"
    for side in ("A", "B"):
        assert sides[side]["figures"]["mean_ttft_ms"] > 0 and sides[side]["figures"]["output_throughput"] > 0
    # greedy on the same token ids (llama.cpp's server: their text) from the same float32 weights
    assert sides["B"]["outputs"][0] == sides["A"]["outputs"][0]


def test_the_benchmark_measures_the_served_model_with_the_same_workload(running_app, server, request):
    api = api_client(running_app.url)
    apply(api, running_app.app, **remote_fields(server))
    report, report_file, runs_csv = api.predict("random", None, 4, 2, 0, "16", "4", 0, True, 0, 0, 0, "",
                                                api_name="/benchmark")
    assert report["backend"] == "remote" and report["errors"] == 0, report.get("first_error")
    assert report["completed"] == 4 and report["mean_ttft_ms"] > 0 and report_file and runs_csv
    # llama.cpp's server takes no ignore_eos (its replies may stop at end-of-sequence) and streams no usage;
    # this app's /v1 honours both: either way the report says what was seen
    assert report["fixed_length"] == ("ignore_eos" not in report["ignored_parameters"])
    if request.node.callspec.params["server"] == LLAMA_CPP:
        assert "stream_options.include_usage" in report["ignored_parameters"]
    else:
        assert report["ignored_parameters"] == {} and report["fixed_length"]
