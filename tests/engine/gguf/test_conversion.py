"""The project's GGUF conversion: llama.cpp's tokenizer reads the same ids the engine's does, the quantized files
have llama.cpp's tensor types and shrink, and the cache follows the checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.gguf import GGUF_TYPES
from engine.gguf.files import checkpoint_key, ensure_gguf, gguf_folder
from engine.hub import load_hf_config, load_tokenizer, resolve_model_path
from engine.prompts import PromptEncoder
from tests.support.llama_cpp_marks import needs_llama_cpp

pytestmark = needs_llama_cpp

PROMPTS = ["Hello world", "What is collections.Counter?", "héllo wörld, naïve café — ünïcode ✓ 日本語 🤖",
           "a   b\t\tc  \n\n\n  d", "   leading spaces", "trailing spaces   ", "line\r\nbreaks\n\nand\ttabs",
           "def add(a, b):\n    return a + b\n", "numbers 1234567 and 3.14159, don't won't I'll",
           "<|im_start|> typed by a user <|im_end|>", "<|endoftext|>x<|im_end|>\n"]
CONTROL_TEXT = PROMPTS[-2:]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does str.split do?"},
            {"role": "assistant", "content": "It splits a string."}, {"role": "user", "content": "héllo  \n x"}]
EXPECTED_MATRIX_TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}


@pytest.fixture(scope="module")
def demo_path() -> Path:
    return resolve_model_path("demo")


@pytest.fixture(scope="module")
def demo_files(demo_path) -> dict[str, Path]:
    hf_config = load_hf_config(demo_path)
    return {gguf_type: ensure_gguf(demo_path, hf_config, gguf_type, 2) for gguf_type in GGUF_TYPES}


def _vocab_only(file: Path):
    from llama_cpp import Llama

    return Llama(str(file), vocab_only=True, verbose=False)


@pytest.mark.parametrize("model", ["demo", "tiny-chat"])
def test_llama_cpp_tokenizes_as_the_engine_does(model, demo_files, tiny_chat_dir):
    path = Path(tiny_chat_dir) if model == "tiny-chat" else resolve_model_path("demo")
    file = demo_files["f32"] if model == "demo" else ensure_gguf(path, load_hf_config(path), "f32", 2)
    tokenizer = load_tokenizer(path)
    encoder = PromptEncoder(tokenizer)
    llama = _vocab_only(file)
    for text in PROMPTS:
        # Text as text: control tokens' text is characters to both (the engine's PromptEncoder also cuts a user's
        # text at such characters, so there it is compared with the tokenizer's own encoding).
        assert llama.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=True), text
        if text not in CONTROL_TEXT:
            assert llama.tokenize(text.encode(), add_bos=False, special=False) == encoder.text(text), text
        assert llama.tokenize(text.encode(), add_bos=False, special=True) == tokenizer.encode(
            text, add_special_tokens=False), text
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ours = encoder.messages(MESSAGES)
    assert llama.tokenize(rendered.encode(), add_bos=False, special=True) == ours  # the template's control tokens
    assert {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")} <= set(ours)


def test_the_demo_files_keep_its_special_tokens_and_template(demo_files):
    from gguf import GGUFReader

    reader = GGUFReader(demo_files["f32"])
    fields = {name: field.contents() for name, field in reader.fields.items()
              if name.startswith(("tokenizer.", "general.architecture"))}
    assert fields["general.architecture"] == "llama"
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    assert fields["tokenizer.ggml.tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert fields["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]  # control, then normal tokens
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"],
            fields["tokenizer.ggml.padding_token_id"]) == (0, 2, 0)
    assert fields["tokenizer.ggml.add_bos_token"] is False
    assert "<|im_start|>" in fields["tokenizer.chat_template"]


def test_quantized_files_have_llama_cpps_types_and_shrink(demo_files):
    from gguf import GGUFReader

    sizes = [demo_files[gguf_type].stat().st_size for gguf_type in GGUF_TYPES]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes), sizes
    for gguf_type, file in demo_files.items():
        types = {tensor.name: tensor.tensor_type.name for tensor in GGUFReader(file).tensors}
        assert "output.weight" not in types  # tied: the embedding matrix is the output
        for layer in (0, 7):
            for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                assert types[f"blk.{layer}.{part}.weight"] == EXPECTED_MATRIX_TYPES[gguf_type], (gguf_type, part)
            assert types[f"blk.{layer}.attn_norm.weight"] == types[f"blk.{layer}.ffn_norm.weight"] == "F32"
        assert types["output_norm.weight"] == "F32"


def test_a_changed_checkpoint_is_converted_again_and_its_stale_files_go(tmp_path, tiny_model_dirs):
    path = tmp_path / "model"
    # without the GGUF files another test may have written beside the shared tiny model
    shutil.copytree(tiny_model_dirs["llama-gqa"], path, ignore=shutil.ignore_patterns("gguf"))
    hf_config = load_hf_config(path)
    first = ensure_gguf(path, hf_config, "q8_0", 2)
    assert first.parent == path / "gguf" and {f.name for f in first.parent.iterdir()} == {
        first.name, first.name.replace("q8_0", "f32")}
    assert ensure_gguf(path, hf_config, "q8_0", 2) == first  # cached
    (path / "config.json").write_text((path / "config.json").read_text() + "\n")  # any change to its files
    second = ensure_gguf(path, hf_config, "f32", 2)
    assert second != first.with_name(first.name.replace("q8_0", "f32"))
    assert [f.name for f in second.parent.iterdir()] == [second.name]


def test_a_read_only_model_folder_gets_a_cache_folder(tmp_path, tiny_model_dirs, monkeypatch):
    path = Path(tiny_model_dirs["llama-gqa"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("engine.gguf.files.os.access", lambda *args: False)
    folder = gguf_folder(path)
    assert folder.is_relative_to(tmp_path / "inference-playground" / "gguf") and folder != gguf_folder(
        Path(tiny_model_dirs["mistral"]))
    assert checkpoint_key(path) == checkpoint_key(path)


def test_other_architectures_are_refused_clearly(tiny_model_dirs, tmp_path):
    path = Path(tiny_model_dirs["qwen2-qkv-bias"])
    with pytest.raises(ModelLoadError, match="Qwen2ForCausalLM is not converted to GGUF"):
        ensure_gguf(path, load_hf_config(path), "f32", 2)
