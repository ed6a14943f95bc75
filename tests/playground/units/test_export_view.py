"""The engine panel's "Run this configuration on vLLM / SGLang" block."""

from __future__ import annotations

import html

from engine import EXPORT_TARGETS as TARGETS
from engine import EngineConfig
from playground.figures.export_view import export_html


def test_block_shows_both_commands_with_versions():
    text = export_html(EngineConfig(max_num_seqs=5, prefix_caching=False))
    assert text.startswith('<details class="export"><summary>Run this configuration on vLLM / SGLang</summary>')
    assert text.endswith("</details>")
    for target in TARGETS.values():
        assert f"{target.label} {target.version}" in text
    plain = html.unescape(text)
    assert "vllm serve" in plain and "--max-num-seqs 5" in plain and "--no-enable-prefix-caching" in plain
    assert "python -m sglang.launch_server" in plain and "--max-running-requests 5" in plain
    assert "--disable-radix-cache" in plain


def test_unmapped_settings_are_listed_and_escaped():
    text = export_html(EngineConfig(batching="static", kv_cache_dtype="int8"))
    assert text.count('class="export-unmapped"') == 2
    assert "<b>batching=&#x27;static&#x27;</b>" in text and "kv_cache_dtype" in text
    assert "Not mapped" not in export_html(EngineConfig(backend="native")).split("SGLang 0.5")[1]


def test_disaggregated_configuration_shows_two_servers_each():
    text = html.unescape(export_html(EngineConfig(disaggregation="prefill-decode")))
    assert text.count("# prefill\n") == 2 and text.count("# decode\n") == 2
    assert "--disaggregation-mode prefill" in text and "NixlConnector" in text
