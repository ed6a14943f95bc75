"""A served model's stats: the server's Prometheus figures where they mean what the engine's stats mean, and every
figure named with its source series."""

from __future__ import annotations

from engine.remote.served import server_stats
from engine.remote.server_metrics import ServerFigure


def test_the_servers_figures_become_the_engines_stats_with_their_sources():
    stats = server_stats([ServerFigure("requests running", 3.0, "vLLM", "vllm:num_requests_running"),
                          ServerFigure("requests waiting", 2.0, "vLLM", "vllm:num_requests_waiting"),
                          ServerFigure("prefix cache hit rate", 0.25, "vLLM", "vllm:prefix_cache_hits_total"),
                          ServerFigure("KV cache usage (fraction)", 0.5, "vLLM", "vllm:kv_cache_usage_perc")])
    assert (stats.num_running, stats.num_waiting, stats.prefix_cache_hit_rate) == (3, 2, 0.25)
    assert "KV cache usage (fraction): 0.5 (vLLM vllm:kv_cache_usage_perc)" in stats.notes
    assert len(stats.notes) == 4


def test_a_metrics_page_without_known_series_says_so():
    assert "none of the series" in server_stats([]).notes[0]
