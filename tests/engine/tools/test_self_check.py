"""The start-up self-check: what a loaded engine runs on (CUDA graphs with the reason they are off), and one short
reply through it."""

from __future__ import annotations

from engine import Engine, EngineConfig, self_check
from engine.plan import cuda_graphs_off


def test_each_reason_cuda_graphs_are_off_is_named():
    config = EngineConfig()
    assert cuda_graphs_off(config, "cpu", "cpu-kernel") == "off: no GPU"
    assert "flash-attn decode path only (attention is sdpa" in cuda_graphs_off(config, "cuda", "sdpa")
    assert cuda_graphs_off(EngineConfig(cuda_graphs=False), "cuda", "flash-attn") == "off: cuda_graphs=False"
    assert "tensor parallelism" in cuda_graphs_off(EngineConfig(tensor_parallel_size=2), "cuda", "flash-attn")
    assert cuda_graphs_off(config, "cuda", "flash-attn") is None


def test_the_check_names_the_engines_paths_and_times_a_reply():
    with Engine(EngineConfig(model="demo")) as engine:
        check = self_check(engine, tokens=8)
    assert check.error is None and check.reply_tokens == 8 and check.reply_ms > 0
    assert (check.backend, check.dtype, check.cuda_graphs) == ("native", engine.info.dtype, "off: no GPU")
    line = check.line()
    assert f"attention {engine.info.attention}" in line and "8-token check reply in" in line
