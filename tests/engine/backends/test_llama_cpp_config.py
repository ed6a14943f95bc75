"""The llama.cpp backend's configuration: what it refuses, each with one clear message, and how it says it is missing.
These run without llama-cpp-python too: the host's answer is stubbed where the refusal comes after it."""

from __future__ import annotations

import pytest

from engine import ConfigError, EngineConfig, ModelLoadError, plan_engine, unavailable_reason

REFUSED = {
    "device": ("cuda", "runs on the CPU"), "dtype": ("bfloat16", "computes in float32"),
    "quantization": ("native-int8", "choose gguf_type"), "kv_cache_dtype": ("int8", "keeps its own KV cache"),
    "attention": ("sdpa", "its own attention"), "speculative": ("ngram", "speculative decoding"),
    "gqa": ("mha", "GQA conversion"), "tensor_parallel_size": (2, "one model"),
    "pipeline_parallel_size": (2, "one model"), "disaggregation": ("prefill-decode", "one model"),
}


@pytest.fixture
def installed(monkeypatch):
    """The host answers that llama-cpp-python is installed, and every other choice is available (the refusal under
    test comes from the llama.cpp backend, not from this host's CUDA or cores)."""
    monkeypatch.setattr("engine.config.llama_cpp_available", lambda: True)
    monkeypatch.setattr("engine.config.unavailable_reason",
                        lambda name, value, device="auto": None)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_what_llama_cpp_cannot_do_is_refused(field, installed):
    value, words = REFUSED[field]
    with pytest.raises(ConfigError, match=f"{field}=.*backend='llama.cpp'.*{words}"):
        EngineConfig(backend="llama.cpp", **{field: value})


@pytest.mark.parametrize("backend", ["auto", "native", "hf"])
def test_a_gguf_type_needs_the_llama_cpp_backend(backend):
    with pytest.raises(ConfigError, match="gguf_type='q4_0' is the llama.cpp backend's weight file"):
        EngineConfig(backend=backend, gguf_type="q4_0")
    assert EngineConfig(backend=backend, gguf_type="f32").gguf_type == "f32"


def test_an_unknown_gguf_type_is_refused():
    with pytest.raises(ConfigError, match="gguf_type='q5_k' is not one of"):
        EngineConfig(gguf_type="q5_k")


def test_without_the_package_it_says_how_to_add_it(monkeypatch):
    monkeypatch.setattr("engine.config.llama_cpp_available", lambda: False)
    reason = unavailable_reason("backend", "llama.cpp")
    assert "pip install llama-cpp-python==0.3.36 gguf==0.19.0" in reason
    with pytest.raises(ConfigError, match="backend='llama.cpp': .*pip install llama-cpp-python==0.3.36"):
        EngineConfig(backend="llama.cpp")
    assert unavailable_reason("backend", "native") is None


def test_the_plan_refuses_an_architecture_it_does_not_convert(monkeypatch, tiny_model_dirs):
    monkeypatch.setattr("engine.config.llama_cpp_available", lambda: True)
    with pytest.raises(ModelLoadError, match="Qwen3ForCausalLM is not converted to GGUF.*llama.cpp backend"):
        plan_engine(EngineConfig(model=tiny_model_dirs["qwen3-qk-norm"], backend="llama.cpp"))


def test_the_plan_says_one_sequence_at_a_time_and_where_the_file_is(monkeypatch, tiny_model_dirs):
    monkeypatch.setattr("engine.config.llama_cpp_available", lambda: True)
    plan = plan_engine(EngineConfig(model=tiny_model_dirs["llama-gqa"], backend="llama.cpp", gguf_type="q8_0",
                                    batching="static", max_model_len=128))
    notices = " / ".join(plan.notices)
    assert "one sequence at a time" in notices and "first in, first out" in notices
    assert "GGUF q8_0" in notices and "ignores batching" in notices and "no tokenizer" in notices
    assert (plan.device, plan.kv_dtype_name, plan.attention) == ("cpu", "float16", "llama.cpp")
    # 128 positions asked, 256 reserved (llama.cpp's multiple); 2 layers x K and V x 2 KV heads x 16 x 2 bytes each
    assert plan.kv_cache_bytes == 256 * plan.kv_bytes_per_token == 256 * 2 * 2 * 2 * 16 * 2
