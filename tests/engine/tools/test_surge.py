"""The surge workload: chat users plus a burst of long prompts, each class reported apart.

The workload is deterministic and labels its classes; the surge is held until the chat users have streamed
their tokens; the chat users' gaps are split by the surge window exactly as engine/tools/surge.py defines it
(checked on hand-made token times); and `python -m engine.bench --surge ... --sweep-set ... --compare-set ...`
writes every figure, one sweep row per value, and the headline ratio.
"""

from __future__ import annotations

import json
import threading

import pytest

from engine import Engine, EngineConfig
from engine.core.metrics import RequestMetrics, percentile
from engine.core.request import RequestOutput
from engine.tools.bench import best_row, main
from engine.tools.measure import send
from engine.tools.surge import class_figures, reference_figures, surge_window, token_times
from engine.tools.workloads import CHAT, SURGE, BenchRequest, SurgeSpec, WorkloadSpec, build_workload, warmup_workload


def chat_and_surge(seed: int = 4) -> WorkloadSpec:
    return WorkloadSpec(num_prompts=3, input_len=5, output_len=8, seed=seed,
                        surge=SurgeSpec(count=4, input_len=40, output_len=2, after_tokens=3, request_rate=20.0))


def test_the_surge_follows_the_chat_requests_labelled_held_and_drawn_from_the_seed():
    spec = chat_and_surge()
    requests = build_workload(spec, 300)
    assert requests == build_workload(spec, 300)
    assert requests != build_workload(chat_and_surge(seed=5), 300)
    chat, surge = requests[:3], requests[3:]
    assert [r.label for r in chat] == [CHAT] * 3 and [r.label for r in surge] == [SURGE] * 4
    assert all(r.after_tokens == 0 and r.max_tokens == 8 and len(r.prompt) == 5 for r in chat)
    # held until the 3 chat requests have streamed 3 tokens each (9 in all); then Poisson at 20/s from that moment
    assert all(r.after_tokens == 9 and r.max_tokens == 2 and len(r.prompt) == 40 for r in surge)
    offsets = [r.arrival for r in surge]
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and len(set(offsets)) == 4
    # the chat requests are the same without the surge: they are its reference
    assert chat == build_workload(WorkloadSpec(num_prompts=3, input_len=5, output_len=8, seed=4), 300)
    warm = warmup_workload(spec, 300)
    assert [len(r.prompt) for r in warm] == [5, 5, 40]


def test_a_surge_it_cannot_describe_is_refused():
    with pytest.raises(ValueError, match="surge"):
        SurgeSpec(count=0, input_len=10, output_len=2, after_tokens=0)
    with pytest.raises(ValueError, match="surge"):
        SurgeSpec(count=1, input_len=10, output_len=2, after_tokens=-1)


def finished(sent: float, times: list[float]) -> tuple[float, RequestOutput]:
    metrics = RequestMetrics.from_timestamps(sent, times, prompt_tokens=4)
    return sent, RequestOutput(-1, [], "", [0] * len(times), "length", metrics)


def test_the_chat_gaps_are_split_by_the_surge_window():
    """Window: first surge submission (2.0) to the last surge first token (4.0). A gap between tokens at a < b is
    during the surge when b > 2.0 and a < 4.0: a gap that ends exactly at 2.0 or starts exactly at 4.0 is outside,
    one that spans an edge is during."""
    timed = [
        # gaps .125 out, 1.125 in (spans 2.0), .25 in, 2.0 in (spans 4.0), .375 out
        finished(0.0, [1.0, 1.125, 2.25, 2.5, 4.5, 4.875]),
        # gaps .5 out (ends at 2.0), 2.0 in, .125 out (starts at 4.0)
        finished(0.0, [1.5, 2.0, 4.0, 4.125]),
        finished(2.0, [4.0, 4.25]),  # the last surge first token
        finished(3.0, [3.5, 3.75]),
        finished(2.5, []),  # a surge request with no token: no first token, and no gap
    ]
    requests = [BenchRequest([1], 8, 0.0), BenchRequest([1], 8, 0.0)] + [BenchRequest([1], 2, 0.0, SURGE, 9)] * 3
    sent_at, outputs = [sent for sent, _ in timed], [output for _, output in timed]
    assert surge_window([(sent, o.metrics) for sent, o in timed[2:]]) == (2.0, 4.0)
    assert token_times(0.0, timed[0][1].metrics) == [1.0, 1.125, 2.25, 2.5, 4.5, 4.875]
    figures = class_figures(requests, outputs, sent_at)
    during, outside = [1125.0, 250.0, 2000.0, 2000.0], [125.0, 375.0, 500.0, 125.0]
    assert figures["chat_itl_during_surge_count"] == 4 and figures["chat_itl_outside_surge_count"] == 4
    assert figures["chat_p99_itl_during_surge_ms"] == pytest.approx(percentile(during, 99))
    assert figures["chat_median_itl_during_surge_ms"] == pytest.approx(percentile(during, 50))
    assert figures["chat_mean_itl_outside_surge_ms"] == pytest.approx(sum(outside) / 4)
    assert figures["chat_p99_itl_outside_surge_ms"] == pytest.approx(percentile(outside, 99))
    assert (figures["surge_window_start_s"], figures["surge_window_end_s"]) == (2.0, 4.0)
    # each class apart: the summary's keys, each class timed from its first submission to its last token
    assert figures["chat_completed"] == 2 and figures["surge_completed"] == 2
    assert figures["chat_median_ttft_ms"] == pytest.approx(1250.0) and figures["surge_median_ttft_ms"] == 1250.0
    assert figures["surge_p99_ttft_ms"] == pytest.approx(percentile([2000.0, 500.0], 99))
    assert figures["chat_duration"] == 4.875 and figures["surge_duration"] == pytest.approx(4.25 - 2.0)
    assert figures["surge_output_throughput"] == pytest.approx(4 / 2.25)


def test_no_window_without_a_surge_token_and_the_ratio_against_the_chat_users_alone():
    requests = [BenchRequest([1], 8, 0.0), BenchRequest([1], 2, 0.0, SURGE, 9)]
    _, chat = finished(0.0, [1.0, 1.5, 2.0])
    _, silent = finished(1.0, [])
    figures = class_figures(requests, [chat, silent], [0.0, 1.0])
    assert "chat_p99_itl_during_surge_ms" not in figures and figures["surge_completed"] == 0
    alone = {"median_itl_ms": 4.0, "p99_itl_ms": 5.0}
    assert reference_figures({"chat_p99_itl_during_surge_ms": 7.5}, alone) == {
        "chat_median_itl_no_surge_ms": 4.0, "chat_p99_itl_no_surge_ms": 5.0, "chat_p99_itl_surge_ratio": 1.5,
        "no_surge": alone}
    assert reference_figures(figures, alone)["chat_p99_itl_surge_ratio"] is None
    # a window (5.0 to 9.0) with no chat gap in it: no figure, rather than a 0 that would pass any target
    late = class_figures(requests, [chat, finished(5.0, [9.0])[1]], [0.0, 5.0])
    assert late["chat_itl_during_surge_count"] == 0 and late["chat_p99_itl_during_surge_ms"] is None


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    engine = Engine(EngineConfig(model=tiny_llama_dir, max_num_seqs=4, max_model_len=512))
    yield engine
    engine.close()


def send_within(engine, requests, concurrency: int, seconds: float = 20.0):
    """`send`, cancelled if it has not returned within `seconds` (a gate that never opens must fail, not hang)."""
    cancel, box = threading.Event(), {}
    sent_at = [None] * len(requests)
    worker = threading.Thread(target=lambda: box.update(result=send(
        engine, requests, concurrency, 0.0, True, 0, cancel=cancel, on_submit=sent_at.__setitem__)))
    worker.start()
    worker.join(seconds)
    hung = worker.is_alive()
    cancel.set()
    worker.join()
    assert not hung, "send did not return: a gated request held it"
    return box["result"][0], sent_at


def test_a_surge_is_sent_once_the_chat_requests_have_streamed_its_tokens(engine):
    chat = [BenchRequest([5 + i, 6, 7, 8], 40, 0.0) for i in range(2)]
    surge = BenchRequest([9] * 30, 2, 0.0, SURGE, after_tokens=10)
    outputs, sent_at = send_within(engine, [*chat, surge], concurrency=3)
    assert [len(o.token_ids) for o in outputs] == [40, 40, 2]
    streamed = [t for sent, o in zip(sent_at[:2], outputs[:2], strict=True) for t in token_times(sent, o.metrics)
                if t <= sent_at[2]]
    assert 10 <= len(streamed) < 80, "sent after the chat requests' 10th token, before their last"


def test_a_gate_opens_when_the_chat_requests_end_and_never_takes_their_threads(engine):
    """Gated requests queue behind the others: with one thread and the surge listed first it still runs, once
    the chat request (3 tokens, fewer than the 50 it waits for) has ended."""
    surge = BenchRequest([9] * 30, 2, 0.0, SURGE, after_tokens=50)
    outputs, sent_at = send_within(engine, [surge, BenchRequest([5, 6, 7], 3, 0.0)], concurrency=1)
    assert [len(o.token_ids) for o in outputs] == [2, 3]
    assert sent_at[0] > sent_at[1] + outputs[1].metrics.e2el


def test_best_row_is_the_lowest_and_never_a_row_without_the_figure():
    rows = {"a": {"x": 3.0}, "b": {"x": 1.0}, "c": {"x": None}, "d": {}}
    assert best_row(rows, "x") == "b"
    assert best_row({"c": {"x": None}, "a": {"x": 3.0}}, "x") == "a"


def test_cli_surge_with_a_sweep_and_a_compare_writes_every_figure(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "surge.json"
    code = main(["--set", f"model={tiny_llama_dir}", "--num-prompts", "2", "--input-len", "6", "--output-len", "10",
                 "--surge", "2:48:3", "--sweep-set", "max_num_batched_tokens=32,64",
                 "--compare-set", "max_num_batched_tokens=128", "--no-roofline", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["workload"]["surge"] == {"count": 2, "input_len": 48, "output_len": 3, "after_tokens": 5,
                                           "request_rate": "inf"}
    assert report["workload"]["concurrency"] == 4
    for result in (report, report["compare"], *report["sweep"]["rows"]):
        assert result["completed"] == 4 and result["chat_completed"] == 2 and result["surge_completed"] == 2
        assert result["chat_total_output_tokens"] == 20 and result["surge_total_input_tokens"] == 96
        assert result["no_surge"]["completed"] == 2 and result["no_surge"]["total_output_tokens"] == 20
        assert result["chat_p99_itl_no_surge_ms"] == result["no_surge"]["p99_itl_ms"]
        assert 0 < result["surge_window_start_s"] <= result["surge_window_end_s"]
        for key in ("chat_p99_ttft_ms", "surge_p99_ttft_ms", "chat_p99_itl_outside_surge_ms", "surge_p99_itl_ms"):
            assert result[key] > 0, key
        if result["chat_itl_during_surge_count"]:
            assert result["chat_p99_itl_surge_ratio"] == pytest.approx(
                result["chat_p99_itl_during_surge_ms"] / result["chat_p99_itl_no_surge_ms"])
    sweep = report["sweep"]
    assert sweep["key"] == "max_num_batched_tokens" and sweep["values"] == [32, 64]
    assert [row["value"] for row in sweep["rows"]] == [32, 64]
    assert [row["config"]["max_num_batched_tokens"] for row in sweep["rows"]] == [32, 64]
    assert sweep["best_by"] == "chat_p99_itl_during_surge_ms" and sweep["best"] in (32, 64)
    assert report["config"]["max_num_batched_tokens"] == sweep["best"]
    assert report["compare"]["config"]["max_num_batched_tokens"] == 128
    assert report["compare_sets"] == {"max_num_batched_tokens": 128}
    for key in ("chat_p99_ttft_ms", "surge_p99_ttft_ms", "total_token_throughput", "chat_p99_itl_during_surge_ms"):
        assert key in report["ratios"]
    printed = capsys.readouterr().out
    assert "sweep of max_num_batched_tokens" in printed and "max_num_batched_tokens=32" in printed
    assert "chat_p99_itl_surge_ratio" in printed and "during the surge" in printed


def test_cli_refuses_surge_options_without_a_surge_and_a_surge_against_an_endpoint():
    with pytest.raises(SystemExit):
        main(["--surge-after", "4"])
    with pytest.raises(SystemExit):
        main(["--endpoint", "http://127.0.0.1:9/v1", "--surge", "1:8:2"])
    with pytest.raises(SystemExit):
        main(["--surge", "1:8"])
    with pytest.raises(SystemExit):
        main(["--sweep-set", "max_num_batched_tokens"])
