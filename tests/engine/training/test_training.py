"""The demo-model build: corpus, questions, answer check, a tiny training run, and the bundled assets."""

from __future__ import annotations

import json
import random
import re
import tomllib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine import Engine, EngineConfig, SamplingParams
from engine.training import evaluate
from engine.training.answer_check import opens_with_reference, repeats_four_words
from engine.training.card import (
    BuildResults,
    bar_rows,
    draft_recipe,
    read_build_record,
    training_passes,
    write_card,
)
from engine.training.corpus import (
    POPULAR_MIN_CHARS,
    answer_for,
    build_corpus,
    everyday_cases,
    follow_up_cases,
    follow_up_chats,
    is_held_out,
    module_of,
    popular_entries,
    popular_entry,
    recall_cases,
    summary,
    without_signature,
)
from engine.training.distill import distillation_loss, target_replies
from engine.training.evaluate import (
    GradedAnswer,
    forward_cost_ratio,
    grade_follow_ups,
    greedy_answer,
    speculative_acceptance,
)
from engine.training.model import (
    ModelShape,
    TrainSettings,
    build_model,
    oversampled_mix,
    token_stream,
    train,
    windows,
)
from engine.training.popular import (
    DEFAULT_POPULAR_ENTRIES,
    EVERYDAY_MODULES,
    POPULAR_NAMES,
    SUGGESTED_QUESTIONS,
    everyday_names,
    popular_names,
    popular_share,
    popular_topics,
)
from engine.training.questions import (
    COMPOSED_TEMPLATES,
    EVERYDAY_TEMPLATES,
    FOLLOW_UP_TEMPLATES,
    FRESH_FOLLOW_UPS,
    FRESH_TEMPLATES,
    FRESH_WORDS,
    GENERIC_TEMPLATES,
    KIND_TEMPLATES,
    SCATTER_WORDS,
    name_form,
    phrase,
    scattered_questions,
    training_questions,
    with_fillers,
)
from engine.training.tokenizer import train_tokenizer
from tests.support.paths import PROJECT_ROOT

ROOT = PROJECT_ROOT
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
    return build_corpus(limit=100, popular_copies=3, scattered_copies=4, follow_up_copies=2)


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory):
    texts = corpus.train_text + [m["content"] for chat in corpus.train_chats for m in chat]
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=400).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_corpus_has_plain_text_chats_and_a_deterministic_held_out_split(corpus):
    assert corpus.train_text and corpus.train_chats and corpus.heldout_entries
    assert is_held_out("module:json") == is_held_out("module:json")
    heldout_questions = {chat[0]["content"] for chat in corpus.heldout_chats}
    assert not heldout_questions & {chat[0]["content"] for chat in corpus.train_chats}
    heldout_groups = {entry.group for entry in corpus.heldout_entries}
    assert all(is_held_out(group) for group in heldout_groups)
    assert not heldout_groups & {entry.group for entry in corpus.train_entries}
    for chat in corpus.train_chats[:50]:
        assert [m["role"] for m in chat] == ["user", "assistant"]
        assert chat[1]["content"].strip()


def test_popular_entries_always_train_and_get_their_extra_chats(corpus):
    assert corpus.popular and all(entry in corpus.train_entries for entry in corpus.popular)
    builtins_group = "module:builtins"
    assert is_held_out(builtins_group) and any(entry.group == builtins_group for entry in corpus.popular)
    answer = answer_for(corpus.popular[0], POPULAR_MIN_CHARS)
    assert [chat[1]["content"] for chat in corpus.train_chats].count(answer) == 2
    single = [chat for chat in corpus.popular_chats if len(chat) == 2]
    assert [chat[1]["content"] for chat in single].count(answer) == 3
    assert len({chat[0]["content"] for chat in single if chat[1]["content"] == answer}) == 3
    more = build_corpus(limit=100, popular_copies=5)
    assert len(more.popular_chats) == 5 * len(corpus.popular) and more.train_chats == corpus.train_chats


def test_popular_entries_keeps_the_everyday_surface_and_the_leading_share_of_every_group():
    everything = popular_names()
    share = popular_share(DEFAULT_POPULAR_ENTRIES)
    kept = popular_names(share)
    assert 0.2 < share < 0.6 and len(kept) < 0.6 * len(everything)
    assert abs(len(kept) + len(popular_topics(share)) - DEFAULT_POPULAR_ENTRIES) < 10
    assert {"print", "len", "json.dumps", "os.path.join", "collections.Counter"} <= set(kept)
    assert all(group.split()[0] in kept for group in POPULAR_NAMES.values())
    everyday = set(EVERYDAY_MODULES) | set(everyday_names())
    assert everyday <= set(popular_names(0.01))
    curated_kept = [name for name in kept if name not in everyday]
    assert curated_kept == [name for name in everything if name in curated_kept]
    assert popular_topics(share)[0] == "the `with` statement" and len(popular_topics(share)) < 30
    assert popular_share(None) == 1.0 and popular_share(10_000) == 1.0


def test_the_everyday_surface_is_each_modules_own_functions_and_classes():
    names = set(everyday_names())
    assert {"glob.glob", "glob.iglob", "glob.escape", "heapq.heapreplace", "bisect.insort", "copy.deepcopy",
            "textwrap.TextWrapper", "shutil.copyfileobj", "os.path.commonpath", "tempfile.gettempdir",
            "itertools.batched" if hasattr(__import__("itertools"), "batched") else "itertools.tee",
            "collections.UserList", "time.monotonic", "json.JSONEncoder"} <= names
    assert not {"shutil.os", "json.JSONDecodeError", "copy.Error", "shutil.Error", "re.error"} & names
    assert {name.rpartition(".")[0] for name in names} <= set(EVERYDAY_MODULES)


def test_popular_limit_shrinks_the_popular_set_and_the_rest_train_as_ordinary_entries(corpus):
    fewer = build_corpus(limit=100, popular_copies=3, popular_limit=200)
    assert 0 < len(fewer.popular) < len(corpus.popular)
    assert len(fewer.popular_chats) == 3 * len(fewer.popular)
    builtins = {entry.name for entry in corpus.popular if entry.group == "module:builtins" and answer_for(entry)}
    dropped = builtins - {entry.name for entry in fewer.popular}
    assert dropped and dropped <= {entry.name for entry in fewer.train_entries}


def test_suggested_questions_ask_about_entries_the_default_build_makes_popular():
    share = popular_share(DEFAULT_POPULAR_ENTRIES)
    kept = set(popular_names(share)) | set(popular_topics(share))
    assert {name for _, name in SUGGESTED_QUESTIONS} <= kept


def test_nearly_every_popular_name_resolves_to_its_own_docstring():
    entries = {entry.name: entry for entry in popular_entries()}
    assert len(entries) >= 0.9 * len(popular_names())
    assert entries["len"].kind == "function" and entries["len"].group == "module:builtins"
    assert entries["str.split"].kind == "method"
    assert entries["collections.Counter"].kind == "class"
    assert answer_for(entries["json.dumps"]).startswith("Serialize `obj` to a JSON formatted `str`.")
    assert answer_for(entries["os.path.join"]).startswith("Join two or more pathname components")


def test_fresh_phrasings_never_appear_in_training(corpus):
    trained_templates = set(GENERIC_TEMPLATES + KIND_TEMPLATES + COMPOSED_TEMPLATES + FOLLOW_UP_TEMPLATES)
    for evaluation_templates in (FRESH_TEMPLATES, EVERYDAY_TEMPLATES, FRESH_FOLLOW_UPS):
        assert not set(evaluation_templates) & trained_templates
    cases = recall_cases(corpus.popular, 20, POPULAR_MIN_CHARS)
    everyday = everyday_cases(corpus.popular, 20)
    follow_ups = follow_up_cases(corpus.popular, 20)
    assert len(cases) == len(everyday) == len(follow_ups) == 20
    training_questions = {message["content"] for chat in corpus.train_chats + corpus.popular_chats
                          + corpus.scattered_chats for message in chat if message["role"] == "user"}
    asked = {q for q, _ in cases + everyday} | {case[0] for case in follow_ups} | {case[2] for case in follow_ups}
    assert corpus.scattered_chats and not asked & training_questions
    fresh_openings = tuple(template.split("{name}")[0].lower() for template in FRESH_TEMPLATES)
    assert all(fresh_openings)
    assert not [question for question in training_questions if question.lower().startswith(fresh_openings)]


def test_the_everyday_set_asks_other_entries_than_the_fresh_set(corpus):
    fresh = {reference for _, reference in recall_cases(corpus.popular, 20, POPULAR_MIN_CHARS)}
    everyday = everyday_cases(corpus.popular, 20)
    assert not fresh & {reference for _, reference in everyday}
    openings = {question.split("`")[0].split(" ")[0].lower() for question, _ in everyday}
    assert len(openings) >= 5


def test_follow_up_chats_ask_a_second_entry_half_the_time_from_the_same_module(corpus):
    chats = follow_up_chats(corpus.popular, 4)
    assert len(chats) > 3 * len(corpus.popular)
    assert all([m["role"] for m in chat] == ["user", "assistant", "user", "assistant"] for chat in chats)
    answers = {answer_for(entry, POPULAR_MIN_CHARS): entry for entry in corpus.popular}
    pairs = [(answers[chat[1]["content"]], answers[chat[3]["content"]]) for chat in chats]
    assert all(first is not second for first, second in pairs)
    same = sum(module_of(first) == module_of(second) for first, second in pairs) / len(pairs)
    assert 0.4 < same < 0.8
    openers = {template.split("{name}")[0] for template in FOLLOW_UP_TEMPLATES if template.split("{name}")[0]}
    follow_up_phrased = [chat for chat in chats if chat[2]["content"].startswith(tuple(openers))]
    assert 0.3 < len(follow_up_phrased) / len(chats) < 0.8
    assert sum(len(chat) == 4 for chat in corpus.popular_chats) == len(follow_up_chats(corpus.popular, 2))


def test_follow_up_chats_ask_a_names_module_after_it_a_third_of_the_same_module_times():
    entries = [e for e in popular_entries() if module_of(e) in ("functools", "queue")]
    assert "functools" in {e.name for e in entries} and "queue" not in {e.name for e in entries}
    answers = {answer_for(entry, POPULAR_MIN_CHARS): entry for entry in entries}
    pairs = [(answers[chat[1]["content"]], answers[chat[3]["content"]]) for chat in follow_up_chats(entries, 60)]
    seconds = [second for first, second in pairs
               if module_of(first) == module_of(second) == "functools" and first.name != "functools"]
    assert 0.2 < sum(second.name == "functools" for second in seconds) / len(seconds) < 0.5
    after_the_module = {second.name for first, second in pairs if first.name == "functools"}
    assert len(after_the_module & {e.name for e in entries if module_of(e) == "functools"}) > 5
    queue_seconds = {second.name for first, second in pairs if first.name == "queue.Queue"}
    assert "queue.PriorityQueue" in queue_seconds


def test_follow_up_cases_pair_a_module_with_its_own_names():
    entries = popular_entries()
    glob_entries = [e for e in entries if module_of(e) == "glob"]
    cases = follow_up_cases(glob_entries + [e for e in entries if e.name == "len"], 4)
    assert len(cases) == 4
    first_question, first_reference, second_question, second_reference = cases[0]
    assert "glob" in first_question and "glob" in second_question and first_reference != second_reference


def test_a_follow_up_answer_that_repeats_the_first_entry_counts_as_a_repeat(monkeypatch):
    first, second = "Return a list of paths matching a pathname pattern.", "Filename globbing utility."
    replies = iter([first, first, first, second])
    monkeypatch.setattr(evaluate, "greedy_answer", lambda model, tokenizer, messages: next(replies))
    graded = grade_follow_ups(None, None, [("Q1", first, "Q2", second), ("Q1", first, "Q2", second)])
    assert [(g.on_topic, g.repeats) for g in graded] == [(False, True), (True, False)]
    assert graded[0].question == "Q1 / Q2"
    deep = "Deep copy operation on arbitrary Python objects."
    shallow = "Shallow copy operation on arbitrary Python objects."
    replies = iter([deep, shallow, deep, deep])
    graded = grade_follow_ups(None, None, [("Q1", deep, "Q2", shallow), ("Q1", deep, "Q2", shallow)])
    assert [(g.on_topic, g.repeats) for g in graded] == [(True, False), (True, True)], \
        "its own sentence is no repeat, however like the first; the first one's sentence again is"


def test_scattered_questions_are_the_name_among_training_words_and_never_a_fresh_one(corpus):
    questions = scattered_questions("method", "pathlib.Path.read_text", 200)
    assert len(set(questions)) > 190
    assert {"pathlib.Path.read_text", "`Path.read_text`", "pathlib.Path.read_text()"} <= {
        word.rstrip("?.!") for question in questions for word in question.split()}
    stray = [word.rstrip("?.!").lower() for question in questions for word in question.split()
             if "read_text" not in word]
    assert {len(q.split()) for q in questions} == set(range(2, 8))
    assert set(stray) <= {word.lower() for word in SCATTER_WORDS} and not set(stray) & FRESH_WORDS
    assert {"explain", "what", "is", "does", "please", "quick", "remind"} <= FRESH_WORDS
    entry = corpus.popular[0]
    answer = answer_for(entry, POPULAR_MIN_CHARS)
    assert [chat[1]["content"] for chat in corpus.scattered_chats].count(answer) == 4
    assert len(corpus.scattered_chats) == 4 * len(corpus.popular)


def test_fillers_go_between_words_never_first_and_never_into_the_name():
    template = "Walk me through {name} in Python."
    filled = {with_fillers(template, random.Random(seed)) for seed in range(40)}
    assert len(filled) > 20
    for question in filled:
        words = question.split(" ")
        assert words[0] == "Walk" and "{name}" in words and len(words) - len(template.split(" ")) in (1, 2)
    assert not set(FRESH_TEMPLATES) & set(COMPOSED_TEMPLATES)


def test_training_questions_use_the_composed_phrasings_and_fillers():
    questions = [q.lower() for q in training_questions("function", "len", 400)]
    composed = [q for q in questions if "walk me through" in q or "some background on" in q]
    filled = [q for q in questions if {"pls", "basically", "um"} & set(q.replace(",", " ").split())]
    assert composed, "no training question uses a COMPOSED_TEMPLATES phrasing"
    assert filled, "no training question carries filler words"


def test_surface_forms_vary_the_way_people_type():
    forms = {name_form("method", "pathlib.Path.read_text", random.Random(seed)) for seed in range(60)}
    assert {"pathlib.Path.read_text", "`pathlib.Path.read_text`", "Path.read_text", "pathlib.Path.read_text()"} <= forms
    topics = {name_form("topic", "the `with` statement", random.Random(seed)) for seed in range(20)}
    assert topics == {"the `with` statement", "the with statement"}
    questions = {phrase("What does {name} do?", "function", "len", random.Random(seed)) for seed in range(60)}
    assert {"what does len do?", "What does `len` do", "What does len() do?"} <= questions


def test_summary_keeps_leading_prose_and_skips_code_grammar_and_parameter_lists():
    text = "First paragraph\nwraps here.\n\nSecond one.\n\n>>> print(1)\n1\n\nAfter the code."
    assert summary(text) == "First paragraph wraps here.\n\nSecond one."
    assert summary("Use it like this:") == "Use it like this."
    assert summary('pass_stmt ::= "pass"\n\nA null operation.\n\n  sep\n    a separator\n\nThe end.') == (
        "A null operation.\n\nThe end."
    )


def test_c_docstring_signatures_are_dropped_and_their_descriptions_kept():
    assert without_signature("map(func, *iterables) --> map object\n\nMake an iterator.") == "Make an iterator."
    assert without_signature("zip(*iterables) --> Yield tuples.\n\nMore.") == "Yield tuples.\n\nMore."
    assert without_signature("repeat(object [,times]) -> create an iterator\nthat repeats.") == (
        "Create an iterator\nthat repeats."
    )
    assert without_signature("int([x]) -> integer\nint(x, base=10) -> integer\n\nConvert.") == "Convert."


def test_a_stream_shorter_than_one_window_gives_no_rows_of_the_same_width():
    assert windows(torch.arange(10), 8).shape == (1, 9)
    short = windows(torch.arange(5), 8)
    assert short.shape == (0, 9) and torch.cat([windows(torch.arange(10), 8), short]).shape == (1, 9)


def test_oversampled_mix_keeps_every_broad_window_and_repeats_the_focus_to_its_share():
    broad = torch.arange(90).reshape(30, 3)
    focus = -torch.arange(1, 13).reshape(4, 3)
    mix = oversampled_mix(focus, broad, focus_share=0.6, seed=0)
    assert len(mix) == 75 and torch.equal(mix[:30], broad)
    focus_rows = mix[30:]
    assert (focus_rows < 0).all()
    counts = [int((focus_rows == row).all(dim=1).sum()) for row in focus]
    assert sum(counts) == 45 and set(counts) <= {11, 12}


def test_popular_share_makes_the_target_train_on_the_oversampled_mix(tmp_path, monkeypatch, one_thread):
    """The whole build on a tiny slice (a few seconds of steps): `--popular-share` reaches the target's pass."""
    import engine.training.__main__ as build

    mixes, trained_on, draft_focus, replies = [], [], [], []
    real_mix, real_train = build.oversampled_mix, build.train
    real_replay, real_replies = build.replay_mix, build.target_replies

    def recording_mix(focus, broad, focus_share, seed):
        mix = real_mix(focus, broad, focus_share, seed)
        mixes.append((len(broad), focus_share, len(mix)))
        return mix

    def recording_train(model, data, settings, **kwargs):
        trained_on.append(len(data))
        return real_train(model, data, settings, **kwargs)

    def recording_replay(focus, broad, replay_share, seed):
        draft_focus.append(focus)
        return real_replay(focus, broad, replay_share, seed)

    def recording_replies(target, tokenizer, questions, **kwargs):
        chats = real_replies(target, tokenizer, questions, max_new_tokens=40)
        replies.append((tokenizer, chats))
        return chats

    monkeypatch.setattr(build, "oversampled_mix", recording_mix)
    monkeypatch.setattr(build, "train", recording_train)
    monkeypatch.setattr(build, "replay_mix", recording_replay)
    monkeypatch.setattr(build, "target_replies", recording_replies)
    build.main(["--out", str(tmp_path), "--limit", "60", "--popular-copies", "2", "--vocab-size", "512",
                "--target-steps", "2", "--recall-steps", "0", "--popular-share", "0.5", "--draft-steps", "2",
                "--draft-replies", "6", "--recall-questions", "2", "--everyday-questions", "2",
                "--follow-up-questions", "2"])
    [(rest, share, mixed)] = mixes
    assert share == 0.5 and mixed == 2 * rest
    assert trained_on[0] == mixed, "the target's pass trains on the mix, not on the broad windows alone"
    record = json.loads((tmp_path / "build.json").read_text())
    assert record["target"]["passes"]["popular_share"] == 0.5 and record["draft"]["replies"] == 6
    assert len(record["everyday_answers"]) == len(record["follow_up_answers"]) == 2
    [(tokenizer, chats)] = replies
    assert len(chats) == 6
    corpus = build_corpus(limit=60, popular_copies=2, popular_limit=DEFAULT_POPULAR_ENTRIES)
    others = windows(token_stream(tokenizer, corpus.train_text, corpus.train_chats), 256)
    assert rest == len(others), "the rest of the mix is the other documents and chats, no popular chat"
    reply_windows = windows(token_stream(tokenizer, [], chats), 256)
    [focus] = draft_focus
    assert len(reply_windows) and torch.equal(focus[-len(reply_windows):], reply_windows), \
        "the draft distills on the target's replies"


def test_recall_pass_trains_on_popular_and_scattered_chats_and_can_be_added_to_a_kept_target(
        tmp_path, monkeypatch, one_thread):
    """A tiny build without a recall pass, then `--add-recall-pass`: only the recall pass trains the kept target,
    at `--recall-lr`, on the popular and scattered chats with replayed broad windows; a second one is refused."""
    import engine.training.__main__ as build

    runs, replays = [], []
    real_train, real_replay = build.train, build.replay_mix

    def recording_train(model, data, settings, **kwargs):
        runs.append((len(data), settings.lr, "loss_fn" in kwargs))
        return real_train(model, data, settings, **kwargs)

    def recording_replay(focus, rest, replay_share, seed):
        replays.append((len(focus), replay_share, len(rest)))
        return real_replay(focus, rest, replay_share, seed)

    monkeypatch.setattr(build, "train", recording_train)
    monkeypatch.setattr(build, "replay_mix", recording_replay)
    tiny = ["--out", str(tmp_path), "--limit", "60", "--popular-copies", "2", "--target-steps", "2",
            "--draft-steps", "2", "--draft-replies", "0", "--recall-questions", "2", "--everyday-questions", "2",
            "--follow-up-questions", "2"]
    build.main([*tiny, "--vocab-size", "512", "--recall-steps", "0"])
    assert [distilled for _, _, distilled in runs] == [False, True], "no recall pass with --recall-steps 0"
    runs.clear(), replays.clear()
    build.main([*tiny, "--add-recall-pass", "--recall-steps", "2", "--recall-lr", "3e-4", "--scattered-copies", "0"])
    build.main([*tiny, "--out", str(tmp_path / "scattered"), "--vocab-size", "512", "--recall-steps", "2",
                "--recall-lr", "3e-4", "--scattered-copies", "3"])
    (without, recall_share, rest), _, (with_scattered, _, _), _ = replays
    assert recall_share == 0.5 and with_scattered > without, "the recall pass trains on the scattered chats"
    assert [(lr, distilled) for _, lr, distilled in runs] == [(3e-4, False), (3e-3, True), (2e-3, False),
                                                            (3e-4, False), (3e-3, True)]
    assert runs[0][0] == without + min(without, rest), "up to half of the recall pass's windows are replayed ones"
    record = read_build_record(tmp_path)
    assert record.target["passes"]["recall"] == 2 and record.target["steps"] == 4
    assert len(record.commands) == 2 and record.target["commands"] == record.commands
    assert list(record.seconds) == ["corpus + tokenizer", "target", "target recall pass", "draft", "evaluation"]
    assert "local_files_only" not in (tmp_path / "demo-chat" / "tokenizer_config.json").read_text()
    with pytest.raises(SystemExit, match="already had its recall pass"):
        build.main([*tiny, "--add-recall-pass"])


def test_target_replies_equal_one_prompt_greedy_answers(tokenizer, one_thread):
    torch.manual_seed(0)
    model = build_model(ModelShape(hidden=32, layers=1, heads=2, intermediate=64), tokenizer).eval()
    questions = ["What does len do?", "Explain the `with` statement to me, please, in a few words.", "zip?"]
    chats = target_replies(model, tokenizer, questions, max_new_tokens=12, batch_size=3)
    assert [chat[0]["content"] for chat in chats] == questions
    assert [chat[1]["content"] for chat in chats] == [
        greedy_answer(model, tokenizer, q, max_new_tokens=12) for q in questions]


def test_card_describes_the_schedule_that_ran():
    one_pass = training_passes({"passes": {"broad": 3000, "popular_share": 0.6, "recall": 0, "recall_replay": 0.2}})
    assert "one pass of 3000 steps" in one_pass and "60%" in one_pass and "recall pass" not in one_pass
    two_pass = training_passes({"passes": {"broad": 700, "recall": 1400, "recall_replay": 0.2}})
    assert "broad pass of 700 steps" in two_pass and "recall pass of 1400 steps" in two_pass
    assert "3000 questions" in draft_recipe({"replies": 3000}) and "replies" not in draft_recipe({})


def test_answer_check_accepts_the_documented_sentence_or_a_close_restatement_only():
    sentence = "Return a new list containing all items from the iterable in ascending order."
    reference = f"{sentence}\n\nMore text."
    assert opens_with_reference(sentence, reference)
    restated = "return a new list containing all the items from the `iterable` in order. Other."
    assert opens_with_reference(restated, reference)
    assert not opens_with_reference("Return the number of items in a container.", reference)
    assert not opens_with_reference("Return a new list. Containing all items from the iterable.", reference)
    assert repeats_four_words("the number of items in the list and the number of items")
    assert not repeats_four_words("Return the number of items in a container.")
    looping = "the number of items in the list and the number of items"
    assert not repeats_four_words(looping, reference=f"{looping} in it"), "quoting the documentation is no loop"
    assert repeats_four_words(f"{looping} and the number of items", reference=looping), "more often than quoted"


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
    settings = TrainSettings(steps=50, seq_len=32, batch_size=8, lr=1e-2, warmup=5)
    target = build_model(TINY_SHAPE, tokenizer)
    report = train(target, data, settings, log=lambda _: None)
    assert report.steps == len(report.losses) == 50 and report.tokens == 50 * 8 * 32
    assert sum(report.losses[-5:]) < sum(report.losses[:5]) * 0.8

    draft = build_model(ModelShape(hidden=16, layers=1, heads=2, intermediate=32), tokenizer)
    distilled = train(draft, data, settings, loss_fn=distillation_loss(target), log=lambda _: None)
    assert sum(distilled.losses[-5:]) < sum(distilled.losses[:5]) * 0.8


def test_a_draft_identical_to_the_target_is_always_accepted(tokenizer, one_thread):
    torch.manual_seed(0)
    model = build_model(TINY_SHAPE, tokenizer).eval()
    accepted, proposed = speculative_acceptance(model, model, tokenizer, ["What is `os`?"], max_new_tokens=12)
    assert proposed > 0 and accepted == proposed


def test_a_shallow_draft_costs_less_per_forward_than_a_deep_target(tokenizer, one_thread):
    shallow = build_model(ModelShape(hidden=64, layers=1, heads=2, intermediate=128), tokenizer).eval()
    deep = build_model(ModelShape(hidden=64, layers=12, heads=2, intermediate=128), tokenizer).eval()
    assert forward_cost_ratio(shallow, deep, rounds=2) < 0.6


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


@pytest.mark.skipif(not (ASSETS / "build.json").is_file(), reason="demo models not built yet")
def test_demo_examples_are_questions_the_build_graded_on_topic():
    examples = tomllib.loads((ROOT / "presets" / "models.toml").read_text())["models"]["demo"].get("examples", [])
    record = json.loads((ASSETS / "build.json").read_text())
    graded = {answer["question"]: answer for answer in record["suggested_answers"]}
    assert {question for question, _ in SUGGESTED_QUESTIONS} == set(graded)
    for question in examples:
        assert graded[question]["on_topic"], question


@pytest.mark.skipif(not (ASSETS / "build.json").is_file(), reason="demo models not built yet")
def test_the_readme_engine_example_prints_the_json_modules_documentation():
    readme = (ROOT / "README.md").read_text()
    question = re.search(r'engine\.generate\(\[\{"role": "user", "content": "([^"]+)"\}\]', readme).group(1)
    assert question == "What does the json module do?"
    with Engine(EngineConfig(model="demo")) as engine:
        reply = engine.generate([{"role": "user", "content": question}], SamplingParams(max_tokens=64))[0]
    assert opens_with_reference(reply.text, answer_for(popular_entry("json"), POPULAR_MIN_CHARS)), reply.text


def test_build_record_round_trips_so_a_draft_can_be_redistilled(tmp_path):
    shape = ModelShape(hidden=32, layers=1, heads=2, intermediate=64)
    model_info = {"params": 1000, "shape": shape, "steps": 3, "tokens": 96, "seconds": 1.5, "cpu_seconds": 2.9,
                  "size_mb": 0.1, "ppl": 9.0}
    answer = GradedAnswer("Q?", "A.", "Ref.", 0.0, False, False)
    results = BuildResults(
        commands=["python -m engine.training --limit 40"], threads=1, vocab_size=400,
        corpus={"train_text": 1, "train_chats": 2, "heldout_text": 1, "heldout_chats": 2,
                "train_tokens": 100, "heldout_tokens": 10, "popular_entries": 1, "popular_copies": 2},
        target=model_info, draft=dict(model_info, params=150),
        baseline={"source": "assets/models/demo-chat", "params": 900, "ppl": 12.5},
        seconds={"corpus + tokenizer": 0.1, "target": 1.5, "draft": 0.5, "evaluation": 0.2},
        cpu_seconds={"corpus + tokenizer": 0.1, "target": 2.9, "draft": 1.0, "evaluation": 0.4},
        num_speculative=4, acceptance={"trained questions": (3, 8)}, draft_cost_ratio=0.2,
        trained_answers=[answer], heldout_answers=[answer], suggested_answers=[answer],
        everyday_answers=[answer], follow_up_answers=[GradedAnswer("Q1 / Q2", "A.", "Ref.", 1.0, True, True)],
    )
    write_card(tmp_path / "README.md", results)
    assert read_build_record(tmp_path) == results
    card = (tmp_path / "README.md").read_text()
    assert "python -m engine.training --limit 40" in card and "**0 min** (CPU time / 1)" in card
    assert "(`assets/models/demo-chat`, 0.0M parameters, its own tokenizer) has perplexity 12.50" in card
    assert "Each later command continued" not in card
    bars = {bar: (measured, met) for bar, measured, met in bar_rows(results)}
    assert bars["popular entries, everyday phrasings: on topic >= 85%"] == ("0%", False)
    assert bars["follow-ups (the second question of a conversation): on topic >= 85%"] == ("100%", True)
    assert bars["follow-ups (the second question of a conversation): repeats 0%"] == ("100%", False)
    assert bars["draft greedy acceptance at k=4 on questions about trained entries >= 0.7"] == ("0.38", False)
    assert "| 1 follow-ups (the second question of a conversation) | 1/1 (100%) | 1/1 (100%) |" in card
    results.commands.append("python -m engine.training --add-recall-pass")
    write_card(tmp_path / "README.md", results)
    assert "Each later command continued" in (tmp_path / "README.md").read_text()
