"""`python -m engine.bench --endpoint` on the remote client: its report against a local fake server, what the server
did not honour said in it, and the key named by --api-key-env sent."""

from __future__ import annotations

import json

from engine.tools.bench import main
from tests.support.misbehaving_server import KEY, MODEL, MisbehavingServer

WORKLOAD = ["--model", MODEL, "--num-prompts", "3", "--input-len", "4", "--output-len", "5", "--concurrency", "2",
            "--no-warmup"]


def bench(server: MisbehavingServer, tmp_path, *extra: str) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    code = main(["--endpoint", server.base_url, *WORKLOAD, "--json", str(report), *extra])
    return code, json.loads(report.read_text())


def test_the_bench_reports_a_servers_figures_from_its_usage(tmp_path):
    with MisbehavingServer("ok") as server:
        code, report = bench(server, tmp_path)
        prompts = [body["prompt"] for path, _, body in server.requests if path == "/v1/completions"][1:]
    assert code == 0 and report["completed"] == 3 and report["errors"] == 0
    assert (report["total_input_tokens"], report["total_output_tokens"]) == (3 * 7, 3 * 5)
    assert report["mean_ttft_ms"] > 0 and report["mean_tpot_ms"] > 0 and report["prefix_cache_hit_rate"] == 4 / 7
    assert report["ignored_parameters"] == {} and report["fixed_length"] is True and report["backend"] == "fake"
    assert all(isinstance(prompt, list) and len(prompt) == 4 for prompt in prompts)  # random prompts as token ids


def test_a_server_that_ignores_ignore_eos_makes_the_workload_not_fixed_length(tmp_path, capsys):
    with MisbehavingServer("ignores_eos") as server:
        code, report = bench(server, tmp_path)
    assert code == 0 and report["fixed_length"] is False
    assert report["ignored_parameters"] == {"ignore_eos": "the reply stopped at 3 of 5 tokens"}
    assert "did not honour ignore_eos (the reply stopped at 3 of 5 tokens); the fixed-length workload was not " \
           "fixed-length" in capsys.readouterr().err


def test_the_bench_sends_the_key_named_by_api_key_env_and_says_which_variable_is_missing(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.delenv("BENCH_TEST_KEY", raising=False)
    with MisbehavingServer("unauthorized") as server:
        assert main(["--endpoint", server.base_url, *WORKLOAD, "--api-key-env", "BENCH_TEST_KEY"]) == 2
        error = capsys.readouterr().err
        assert "set the environment variable BENCH_TEST_KEY" in error
        monkeypatch.setenv("BENCH_TEST_KEY", KEY)
        code, report = bench(server, tmp_path, "--api-key-env", "BENCH_TEST_KEY")
        assert code == 0 and report["completed"] == 3
        assert KEY not in capsys.readouterr().out + json.dumps(report)


def test_an_unknown_model_fails_the_bench_naming_the_served_ones(capsys):
    with MisbehavingServer("ok") as server:
        assert main(["--endpoint", server.base_url, *WORKLOAD[2:], "--model", "nope"]) == 2
    assert "does not serve the model 'nope'; it serves: test-model, other" in capsys.readouterr().err
