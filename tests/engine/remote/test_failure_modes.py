"""The remote client against a server that misbehaves on purpose: each failure is one clear RemoteError, within its
timeout, the text streamed before it kept, and no thread of the client left running."""

from __future__ import annotations

import time

import pytest

from engine import SamplingParams
from engine.errors import RemoteError
from engine.remote import RemoteEngine, RemoteTarget, RemoteTimeouts
from tests.support.misbehaving_server import KEY, MODEL, MisbehavingServer, closed_port_url, unanswered_connect_url

FAST = RemoteTimeouts(connect=1.0, first_token=0.6, inter_token=0.4, retries=1)
SLACK_S = 0.5  # a bound's allowance for a loaded CI machine's scheduling
CHAT = [{"role": "user", "content": "hi"}]


def run(server_url: str, prompt="Say hi", params: SamplingParams | None = None, timeouts=FAST,
        api_key_env: str | None = None):
    """(output, seconds) of one request."""
    with RemoteEngine(RemoteTarget(server_url, MODEL, api_key_env), timeouts) as remote:
        started = time.monotonic()
        output = remote.submit(prompt, params or SamplingParams(max_tokens=5)).result()
        return output, time.monotonic() - started


def failure(output) -> RemoteError:
    assert output.finish_reason == "error" and output.error, output
    return output


def test_a_well_behaved_stream_gives_the_text_and_the_servers_usage():
    with MisbehavingServer("ok") as server:
        for prompt in ("Say hi", [1, 2, 3], CHAT):
            output, _ = run(server.base_url, prompt)
            assert output.finish_reason == "length" and output.text == "Hello, world! Bye" and output.error is None
            metrics = output.metrics
            assert (metrics.prompt_tokens, metrics.output_tokens, metrics.cached_tokens) == (7, 5, 4)
            assert 0 < metrics.ttft <= metrics.e2el and len(metrics.itl) == 4 and metrics.tpot > 0
            assert output.ignored == {}
        bodies = [body for path, _, body in server.requests if path.endswith("completions")]
        assert [b.get("prompt", b.get("messages")) for b in bodies] == ["Say hi", [1, 2, 3], CHAT]
        assert all(b["stream_options"] == {"include_usage": True} and "ignore_eos" not in b for b in bodies)


def test_streaming_deltas_carry_text_and_running_figures():
    with MisbehavingServer("ok") as server, RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
        deltas = list(remote.stream(CHAT, SamplingParams(max_tokens=5)))
    assert "".join(d.text for d in deltas) == "Hello, world! Bye"
    assert [d.finished for d in deltas] == [False] * 5 + [True] and deltas[-1].finish_reason == "length"
    assert deltas[0].metrics.ttft > 0 and deltas[0].token_ids == []


def test_a_refused_connection_is_unreachable_after_its_retries():
    output, elapsed = run(closed_port_url())
    assert failure(output).error.startswith("cannot reach http://127.0.0.1:") and output.text == ""
    assert elapsed < 2.0


def test_a_connect_that_is_never_answered_hits_the_connect_timeout_on_each_attempt():
    timeouts = RemoteTimeouts(connect=0.3, first_token=5, inter_token=5, retries=1)
    with unanswered_connect_url() as url:
        output, elapsed = run(url, timeouts=timeouts)
    assert "cannot reach" in failure(output).error and "ConnectTimeout" in output.error
    assert 2 * timeouts.connect <= elapsed < 2 * timeouts.connect + 0.2 + SLACK_S  # two attempts and one pause


def test_an_http_error_and_an_error_event_carry_the_servers_own_message():
    with MisbehavingServer("server_error") as server:
        output, _ = run(server.base_url)
        assert failure(output).error == f"{server.base_url}/completions answered HTTP 500: CUDA out of memory"
        assert len(server.requests) == 1  # a response came: never retried
    with MisbehavingServer("error_event") as server:
        output, _ = run(server.base_url)
    assert "failed the request mid-stream: the engine failed this request" in failure(output).error
    assert output.text == "Hello,"


def test_a_reset_before_any_byte_is_retried_once_and_then_answered():
    with MisbehavingServer("reset_once") as server:
        output, _ = run(server.base_url)
        assert output.finish_reason == "length" and output.text == "Hello, world! Bye"
        assert len([p for p, _, _ in server.requests if p == "/v1/completions"]) == 2


def test_a_drop_mid_stream_keeps_the_partial_text_and_is_never_retried():
    with MisbehavingServer("drop_mid") as server:
        output, elapsed = run(server.base_url)
        assert "dropped the stream mid-reply after 2 chunk(s)" in failure(output).error
        assert output.text == "Hello,"
        assert len([p for p, _, _ in server.requests if p == "/v1/completions"]) == 1
    assert elapsed < 1.0


def test_a_server_that_stalls_before_the_first_token_hits_the_first_token_timeout():
    """It keeps sending keep-alive comments, so only an enforced deadline (not a per-read timeout) ends the wait."""
    with MisbehavingServer("stall_first") as server:
        for prompt in ("Say hi", CHAT):
            output, elapsed = run(server.base_url, prompt)
            assert "no text within the first-token timeout (0.6 s)" in failure(output).error
            assert FAST.first_token <= elapsed < FAST.first_token + SLACK_S
        assert len([p for p, _, _ in server.requests if p.endswith("completions")]) == 2  # never retried


def test_describe_against_a_stalled_server_ends_at_the_first_token_timeout():
    with MisbehavingServer("stall_first") as server, RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
        started = time.monotonic()
        with pytest.raises(RemoteError, match=r"sent no whole reply within the first-token timeout \(0.6 s\)") as late:
            remote.describe()
        elapsed = time.monotonic() - started
    assert late.value.kind == "first_token_timeout" and FAST.first_token <= elapsed < FAST.first_token + SLACK_S


def test_a_server_that_stalls_mid_stream_hits_the_inter_token_timeout_and_keeps_the_text():
    with MisbehavingServer("stall_mid") as server:
        output, elapsed = run(server.base_url)
    assert "inter-token timeout (0.4 s) after 2 chunk(s)" in failure(output).error and output.text == "Hello,"
    assert FAST.inter_token <= elapsed < FAST.inter_token + SLACK_S


def test_cancel_closes_a_stalled_stream_at_once():
    slow = RemoteTimeouts(first_token=30, inter_token=30)
    with MisbehavingServer("stall_mid") as server, RemoteEngine(RemoteTarget(server.base_url, MODEL), slow) as remote:
        handle = remote.submit("Say hi", SamplingParams(max_tokens=5))
        deltas = iter(handle)
        first, second = next(deltas), next(deltas)  # the stall comes after these two
        started = time.monotonic()
        handle.cancel()
        output = handle.result()
        elapsed = time.monotonic() - started
    assert (first.text, second.text) == ("Hello", ",") and output.finish_reason == "cancelled" and output.error is None
    assert output.text == "Hello," and elapsed < SLACK_S


def test_401_names_the_environment_variable_and_never_the_key(monkeypatch):
    with MisbehavingServer("unauthorized") as server:
        monkeypatch.delenv("TEST_REMOTE_KEY", raising=False)
        output, _ = run(server.base_url, api_key_env="TEST_REMOTE_KEY")
        assert "set the environment variable TEST_REMOTE_KEY" in failure(output).error
        assert "Incorrect API key provided" in output.error
        output, _ = run(server.base_url)
        assert "name the environment variable that holds it" in failure(output).error
        monkeypatch.setenv("TEST_REMOTE_KEY", "wrong-" + KEY)
        output, _ = run(server.base_url, api_key_env="TEST_REMOTE_KEY")
        assert "was not accepted" in failure(output).error and KEY not in output.error
        monkeypatch.setenv("TEST_REMOTE_KEY", KEY)
        output, _ = run(server.base_url, api_key_env="TEST_REMOTE_KEY")
        assert output.finish_reason == "length"
        assert server.requests[-1][1]["Authorization"] == f"Bearer {KEY}"
        target = RemoteTarget(server.base_url, MODEL, "TEST_REMOTE_KEY")
        assert KEY not in repr(target) and KEY not in repr(RemoteEngine(target).target)


def test_an_unknown_model_is_said_with_the_servers_message():
    with MisbehavingServer("unknown_model") as server:
        output, _ = run(server.base_url)
    assert failure(output).error.startswith(f"{server.base_url} does not serve the model {MODEL!r}")
    assert "does not exist" in output.error


def test_a_redirect_is_not_followed_and_names_its_location():
    with MisbehavingServer("redirect") as server:
        output, _ = run(server.base_url)
        assert "answered 302, redirecting to http://169.254.169.254/latest/meta-data/" in failure(output).error
        assert len(server.requests) == 1


def test_a_reply_that_is_not_json_is_a_bad_reply():
    with MisbehavingServer("bad_json") as server:
        output, elapsed = run(server.base_url)
    assert "sent an event that is not JSON" in failure(output).error and elapsed < 1.0


def test_a_server_that_ignores_ignore_eos_or_max_tokens_is_said_so():
    with MisbehavingServer("ignores_eos") as server:
        output, _ = run(server.base_url, params=SamplingParams(max_tokens=5, ignore_eos=True))
        assert server.requests[-1][2]["ignore_eos"] is True
    assert output.finish_reason == "stop" and output.metrics.output_tokens == 3
    assert output.ignored == {"ignore_eos": "the reply stopped at 3 of 5 tokens"}
    with MisbehavingServer("too_many") as server:
        output, _ = run(server.base_url, params=SamplingParams(max_tokens=4))
    assert output.ignored == {"max_tokens": "6 tokens for max_tokens=4"}


def test_many_requests_stream_at_once():
    with MisbehavingServer("ok") as server, RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
        outputs = remote.generate(["a", "b", "c", "d", "e", "f"], SamplingParams(max_tokens=5))
    assert [o.text for o in outputs] == ["Hello, world! Bye"] * 6


def test_describe_lists_the_models_and_reads_this_apps_extras():
    with MisbehavingServer("ok") as server:
        with RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
            described = remote.describe()
        assert described["models"] == [MODEL, "other"] and described["engine"]["vocab_size"] == 100
        with RemoteEngine(RemoteTarget(server.base_url, "missing"), FAST) as remote, \
                pytest.raises(RemoteError, match="does not serve the model 'missing'; it serves: test-model, other"):
            remote.describe()


def test_server_metrics_maps_known_series_and_is_none_without_a_page():
    with MisbehavingServer("ok") as server, RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
        figures = {f.label: (f.value, f.source, f.series) for f in remote.server_metrics()}
    assert figures == {
        "requests running": (3.0, "vLLM", "vllm:num_requests_running"),
        "requests waiting": (1.0, "vLLM", "vllm:num_requests_waiting"),
        "KV cache usage (fraction)": (0.25, "vLLM", "vllm:kv_cache_usage_perc"),
        "prefix cache hit rate": (0.25, "vLLM", "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total")}
    with MisbehavingServer("ok", metrics=None) as server, \
            RemoteEngine(RemoteTarget(server.base_url, MODEL), FAST) as remote:
        assert remote.server_metrics() is None
