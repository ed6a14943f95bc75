"""What a target and its timeouts accept, and the mapping of SGLang's and llama.cpp's Prometheus series (vLLM's is
checked through a served page in test_failure_modes.py)."""

from __future__ import annotations

import pytest

from engine.errors import ConfigError
from engine.remote import RemoteTarget, RemoteTimeouts
from engine.remote.server_metrics import map_figures, parse_samples

SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2
sglang:num_running_reqs{model_name="m",tp_rank="1"} 3
sglang:num_queue_reqs{model_name="m"} 4
sglang:token_usage{model_name="m",tp_rank="0"} 0.2
sglang:token_usage{model_name="m",tp_rank="1"} 0.4
sglang:cache_hit_rate{model_name="m"} 0.5
sglang:spec_accept_length{model_name="m"} 2.5
"""
LLAMA_CPP = """# HELP llamacpp:requests_processing Number of requests processing.
llamacpp:requests_processing 1
llamacpp:requests_deferred 0
llamacpp:kv_cache_usage_ratio 0.125
llamacpp:prompt_tokens_seconds 250.5
llamacpp:predicted_tokens_seconds 31.25
llamacpp:prompt_tokens_total 1e3 1712345678000
"""


def test_sglang_and_llama_cpp_series_map_to_the_same_labels():
    sglang = {f.label: (f.value, f.source) for f in map_figures(parse_samples(SGLANG))}
    assert sglang == {"requests running": (5, "SGLang"), "requests waiting": (4, "SGLang"),
                      "KV cache usage (fraction)": (pytest.approx(0.3), "SGLang"),
                      "prefix cache hit rate": (0.5, "SGLang"), "speculative accept length": (2.5, "SGLang")}
    llama = {f.label: f.value for f in map_figures(parse_samples(LLAMA_CPP))}
    assert llama == {"requests running": 1, "requests waiting": 0, "KV cache usage (fraction)": 0.125,
                     "prompt throughput (tokens/s)": 250.5, "generation throughput (tokens/s)": 31.25}


def test_the_parser_skips_comments_and_bad_lines_and_reads_timestamps_and_quoted_braces():
    text = 'a{x="}{",y="\\"q\\""} 1.5\n# comment\nbad line here\nb 2 1700000000\nc{unclosed="x} 3\nd NaN\n'
    series = parse_samples(text)
    assert series["a"] == [1.5] and series["b"] == [2.0] and "c" not in series and "bad" not in series
    assert map_figures({"vllm:prefix_cache_hits_total": [5.0], "vllm:prefix_cache_queries_total": [0.0]}) == []


def test_a_target_is_a_url_and_a_model_and_never_holds_the_key():
    target = RemoteTarget("http://127.0.0.1:8000/v1/", "m", "MY_KEY")
    assert target.base_url == "http://127.0.0.1:8000/v1" and target.server_root == "http://127.0.0.1:8000"
    assert RemoteTarget("https://h.example/api", "m").server_root == "https://h.example"
    assert hash(target) == hash(RemoteTarget("http://127.0.0.1:8000/v1", "m", "MY_KEY"))
    for url in ("ftp://h/v1", "not a url", "http://user:secret@h/v1", "http://h/v1?key=x"):
        with pytest.raises(ConfigError):
            RemoteTarget(url, "m")
    with pytest.raises(ConfigError, match="non-empty model"):
        RemoteTarget("http://h/v1", " ")
    with pytest.raises(ConfigError, match="api_key_env must name an environment variable"):
        RemoteTarget("http://h/v1", "m", "sk-123")


def test_timeouts_are_positive_and_retries_bounded():
    for bad in ({"connect": 0}, {"first_token": -1}, {"inter_token": float("inf")}, {"connect": True}):
        with pytest.raises(ConfigError, match="timeout must be a positive number"):
            RemoteTimeouts(**bad)
    with pytest.raises(ConfigError, match="retries"):
        RemoteTimeouts(retries=-1)
