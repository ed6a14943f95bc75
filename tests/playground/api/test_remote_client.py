"""The remote client (`engine.remote`) against this app's own OpenAI-compatible `/v1`, started in-process: what the
playground will show when it targets a server, checked against the server the playground itself is."""

from __future__ import annotations

import time

import pytest

from engine import SamplingParams
from engine.errors import RemoteError
from engine.remote import RemoteEngine, RemoteTarget, RemoteTimeouts
from playground.shared.settings import Settings
from tests.support.ui_helpers import serving

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What does the json module do?"}]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=200, max_prompt_tokens=400)) as served:
        with RemoteEngine(RemoteTarget(served.url + "v1", served.model), RemoteTimeouts(first_token=60)) as engine:
            yield served, engine


def test_a_chat_streams_the_engines_text_with_its_usage(remote):
    served, engine = remote
    with served.app.pool.lease(served.app.default_config) as entry:
        local = entry.engine.generate([entry.engine.encode(QUESTION)], SamplingParams(max_tokens=12))[0]
    deltas = list(engine.stream(QUESTION, SamplingParams(max_tokens=12)))
    output_text = "".join(delta.text for delta in deltas)
    assert output_text == local.text and deltas[-1].finish_reason == local.finish_reason
    metrics = deltas[-1].metrics
    assert metrics.output_tokens == len(local.token_ids) and metrics.prompt_tokens == len(local.prompt_token_ids)
    assert 0 < metrics.ttft <= metrics.e2el


def test_describe_reads_the_apps_model_extras_and_names_the_served_models(remote):
    served, engine = remote
    described = engine.describe()
    assert described["models"][0] == served.model and described["engine"]["vocab_size"] > 0
    assert described["config"]["model"]
    with RemoteEngine(RemoteTarget(served.url + "v1", "no-such-model")) as missing, \
            pytest.raises(RemoteError, match=f"does not serve the model 'no-such-model'; it serves: {served.model}"):
        missing.describe()


def test_ignore_eos_is_honoured_by_this_app(remote):
    output = remote[1].submit("Hi", SamplingParams(max_tokens=20, ignore_eos=True)).result()
    assert output.finish_reason == "length" and output.metrics.output_tokens == 20 and output.ignored == {}


def test_cancel_stops_the_request_on_the_server(remote):
    served, engine = remote
    handle = engine.submit("Tell me a long story.", SamplingParams(max_tokens=200, ignore_eos=True))
    next(iter(handle))
    handle.cancel()
    assert handle.result().finish_reason == "cancelled"
    with served.app.pool.lease(served.app.default_config) as entry:
        deadline = time.monotonic() + 30
        while entry.engine.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert entry.engine.stats().num_running == 0


def test_server_metrics_is_none_without_a_metrics_page(remote):
    assert remote[1].server_metrics() is None
