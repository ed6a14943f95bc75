"""The demo-model build: corpus, tokenizer, a tiny training run, and the bundled assets."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.training.card import BuildResults, read_build_record, write_card
from engine.training.corpus import DocEntry, NameParts, answer_for, build_corpus, is_held_out, renamed, summary
from engine.training.distill import distillation_loss
from engine.training.evaluate import speculative_acceptance
from engine.training.model import ModelShape, TrainSettings, build_model, token_stream, train, windows
from engine.training.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets" / "models"
TINY_SHAPE = ModelShape(hidden=32, layers=1, heads=2, intermediate=64)


@pytest.fixture
def one_thread():
    """Tiny models train ten times faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(limit=60)


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    texts = corpus.train_text + [m["content"] for chat in corpus.train_chats for m in chat]
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=400).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_corpus_has_plain_text_chats_and_a_deterministic_held_out_split(corpus):
    assert corpus.train_text and corpus.train_chats and corpus.heldout_entries
    assert is_held_out("module:json") == is_held_out("module:json")
    assert all(entry.held_out for entry in corpus.heldout_entries)
    heldout_questions = {chat[0]["content"] for chat in corpus.heldout_chats}
    assert not heldout_questions & {chat[0]["content"] for chat in corpus.train_chats}
    kinds = {entry.kind for entry in corpus.heldout_entries}
    assert "topic" in kinds
    for chat in corpus.train_chats[:50]:
        assert [m["role"] for m in chat] == ["user", "assistant"]
        assert chat[1]["content"].strip()


def test_summary_keeps_leading_prose_and_stops_before_code():
    text = "First paragraph\nwraps here.\n\nSecond one.\n\n>>> print(1)\n1\n\nAfter the code."
    assert summary(text) == "First paragraph wraps here.\n\nSecond one."
    assert summary("Use it like this:") == "Use it like this."


def test_tokenizer_loads_with_chat_template_and_end_of_turn_eos(tokenizer):
    messages = [{"role": "user", "content": "What does the `json.dumps` function do?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat does the `json.dumps` function do?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == tokenizer.bos_token == "<|endoftext|>"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids
    assert tokenizer.decode(tokenizer("héllo wörld\n  x").input_ids) == "héllo wörld\n  x"


def test_tiny_model_and_distilled_draft_losses_fall(corpus, tokenizer, one_thread):
    torch.manual_seed(0)
    data = windows(token_stream(tokenizer, corpus.train_text, corpus.train_chats), 32)[:64]
    settings = TrainSettings(minutes=1, steps=50, seq_len=32, batch_size=8, lr=1e-2, warmup=5)
    target = build_model(TINY_SHAPE, tokenizer)
    report = train(target, data, settings, log=lambda _: None)
    assert sum(report.losses[-5:]) < sum(report.losses[:5]) * 0.8

    draft = build_model(ModelShape(hidden=16, layers=1, heads=2, intermediate=32), tokenizer)
    distilled = train(draft, data, settings, loss_fn=distillation_loss(target), log=lambda _: None)
    assert sum(distilled.losses[-5:]) < sum(distilled.losses[:5]) * 0.8


def test_a_draft_identical_to_the_target_is_always_accepted(tokenizer, one_thread):
    torch.manual_seed(0)
    model = build_model(TINY_SHAPE, tokenizer).eval()
    accepted, proposed = speculative_acceptance(model, model, tokenizer, ["What is `os`?"], max_new_tokens=12)
    assert proposed > 0 and accepted == proposed


@pytest.mark.skipif(not (ASSETS / "README.md").is_file(), reason="demo models not built yet")
def test_bundled_demo_models_load_offline_and_fit_the_contract():
    target = AutoModelForCausalLM.from_pretrained(ASSETS / "demo-chat", local_files_only=True)
    draft = AutoModelForCausalLM.from_pretrained(ASSETS / "demo-draft", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "demo-chat", local_files_only=True)
    assert AutoTokenizer.from_pretrained(ASSETS / "demo-draft", local_files_only=True).get_vocab() == (
        tokenizer.get_vocab()
    )
    for model in (target, draft):
        assert model.config.model_type == "llama"
        assert model.config.num_key_value_heads == model.config.num_attention_heads
        assert model.config.vocab_size == len(tokenizer)
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    target_params = sum(p.numel() for p in target.parameters())
    draft_params = sum(p.numel() for p in draft.parameters())
    assert target_params <= 30_000_000
    assert draft_params * 5 <= target_params

    messages = [{"role": "user", "content": "Explain the `with` statement."}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    output = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert output.shape[1] > ids.shape[1]
    assert (ASSETS / "README.md").is_file()


def test_model_presets_point_demo_at_its_bundled_draft():
    models = tomllib.loads((ROOT / "presets" / "models.toml").read_text())["models"]
    assert models["demo"]["source"] == "assets/models/demo-chat"
    assert models["demo"]["draft"] == "demo-draft"
    assert models["demo-draft"]["source"] == "assets/models/demo-draft"
    assert [name for name, entry in models.items() if entry.get("default")] == ["demo"]
    for name, entry in models.items():
        assert {"source", "label", "params", "memory"} <= entry.keys(), name
        draft = entry.get("draft")
        assert draft is None or draft in models or "/" in draft, name


def test_build_record_round_trips_so_a_draft_can_be_redistilled(tmp_path):
    shape = ModelShape(hidden=32, layers=1, heads=2, intermediate=64)
    model_info = {"params": 1000, "shape": shape, "steps": 3, "tokens": 96, "seconds": 1.5, "size_mb": 0.1, "ppl": 9.0}
    results = BuildResults(
        commands=["python -m engine.training --limit 40"], threads=1, vocab_size=400,
        corpus={"train_text": 1, "train_chats": 2, "heldout_text": 1, "heldout_chats": 2,
                "train_tokens": 100, "heldout_tokens": 10},
        target=model_info, draft=dict(model_info, params=150), seconds={"target": 1.5, "draft": 0.5},
        acceptance=(3, 8), num_speculative=4, acceptance_prompts=2, samples=[("Q?", "A.", "Ref.")],
    )
    write_card(tmp_path / "README.md", results)
    assert read_build_record(tmp_path) == results
    assert "python -m engine.training --limit 40" in (tmp_path / "README.md").read_text()


def test_answers_open_by_naming_what_was_asked_about():
    doc = "Return a JSON string representation of a Python data structure."
    entry = DocEntry("method", "json.JSONEncoder.encode", f"json.JSONEncoder.encode\n\n{doc}", "module:json")
    opening = "The `json.JSONEncoder.encode` method belongs to the `json.JSONEncoder` class."
    assert answer_for(entry) == f"{opening}\n\n{doc}"
    topic = DocEntry("topic", "the `with` statement", "The `with` statement wraps a block in a context manager.", "t")
    assert answer_for(topic) == f"This part of the Python reference is about the `with` statement.\n\n{topic.text}"


def test_renamed_entries_get_an_invented_name_of_the_same_shape_everywhere():
    parts = NameParts(identifier_words=["parse", "buffer", "node", "token"], title_words=["loops", "names"])
    text = "Encode `encode` input; see `json.JSONEncoder.encode` and call `encode(obj)`. Do not encode twice."
    entry = DocEntry("method", "json.JSONEncoder.encode", text, "module:json")
    renamed_entry = renamed(entry, parts)
    assert renamed_entry == renamed(entry, parts)
    module, owner, method = renamed_entry.name.split(".")
    assert module.isalpha() and module == module.lower()
    assert owner[0].isupper() and set(method.split("_")) <= set(parts.identifier_words)
    assert "encode" not in renamed_entry.text.replace("Encode", "").replace("encode twice", "")
    assert renamed_entry.text.count(method) == 3 and renamed_entry.text.startswith("Encode `")
    opening = f"The `{renamed_entry.name}` method belongs to the `{module}.{owner}` class."
    assert answer_for(renamed_entry).startswith(opening)
    topic = renamed(DocEntry("topic", "the `with` statement", "Blocks.", "topic:with"), parts)
    assert set(topic.name.split()) <= {"loops", "names"}


def test_each_training_entry_gets_one_renamed_chat_and_held_out_chats_keep_real_names(corpus):
    def asked_name(chat: list[dict]) -> str:
        opener = chat[1]["content"].partition("\n")[0]
        match = re.match(r"The `([^`]+)`|This part of the Python reference is about (.+)\.$", opener)
        return match.group(1) or match.group(2)

    train_names = {entry.name for entry in corpus.train_entries}
    names = [asked_name(chat) for chat in corpus.train_chats]
    real = sum(name in train_names for name in names)
    assert real == 2 * (len(names) - real) > 0
    heldout_names = {entry.name for entry in corpus.heldout_entries}
    assert all(asked_name(chat) in heldout_names for chat in corpus.heldout_chats)
    assert not set(names) & heldout_names
