"""GPU-only: native greedy output equals transformers' on CUDA in float32. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.tools.gpu_check import reference_greedy
from tests.support.tiny_models import build_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [3] * 40, [100, 200, 300, 17, 42, 7]]
MAX_TOKENS = 16


@pytest.fixture
def no_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("architecture", ["llama-gqa", "qwen3-qk-norm"])
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_native_equals_transformers_on_cuda(tmp_path, no_tf32, architecture, batching):
    path = build_tiny_model(architecture, tmp_path / architecture)
    expected = reference_greedy(path, PROMPTS, MAX_TOKENS, torch.float32)
    config = EngineConfig(model=path, backend="native", device="cuda", dtype="float32", attention="sdpa",
                          batching=batching)
    with Engine(config) as engine:
        outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        assert engine.info.device == "cuda"
    assert [o.token_ids for o in outputs] == expected


def test_hf_backend_runs_on_cuda(tmp_path):
    path = build_tiny_model("llama-gqa", tmp_path / "llama")
    with Engine(EngineConfig(model=path, backend="hf", device="cuda", dtype="float32")) as engine:
        output = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert output.finish_reason == "length" and len(output.token_ids) == 4
