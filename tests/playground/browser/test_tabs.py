"""The Compare, Benchmark and Glossary tabs in a real headless Chromium (as test_chat_and_panel.py drives the chat).

A person's path through each tab: a comparison with the baseline column, its ratio table, both outputs with their
differences marked and the overlaid charts; chat with both; a benchmark that runs with a progress bar, is
cancelled, runs again, exports and overlays an earlier run; the glossary and the tooltips. Screenshots go to
PLAYGROUND_SCREENSHOT_DIR when set (the README's images are made that way), else to a temporary folder.
"""

from __future__ import annotations

import json

from tests.playground.browser.actions import (
    BROWSER_MARKS,
    assert_axes_readable,
    fill_text,
    open_page,
    open_tab,
    pick,
    tall_screenshot,
)

pytestmark = BROWSER_MARKS


def lines_drawn(page, chart: str) -> list[str]:
    return page.eval_on_selector_all(f"{chart} polyline.run-line", "lines => lines.map(l => l.dataset.series)")


def open_compare_with_b(page, changes: str) -> None:
    """The Compare tab, B the engine panel with `changes`."""
    open_tab(page, "Compare")
    page.wait_for_selector("#cmp-run", state="visible")
    page.click("#cmp-b-source input")
    page.click('[role=option][aria-label="engine panel"]')
    fill_text(page, "#cmp-b-changes", changes)


def test_compare_shows_both_outputs_their_differences_the_ratio_table_and_overlaid_charts(page, shots):
    open_compare_with_b(page, "gqa=4")
    assert "order alternates" in page.get_attribute("#cmp-repeats", "title")
    page.wait_for_function("document.querySelector('#cmp-b-resolved').innerText.includes('GQA 4')", timeout=10_000)
    pick(page, "#cmp-baseline", "transformers")
    page.locator("#cmp-perplexity input").check()
    page.locator("#cmp-run").click()
    page.wait_for_selector("#cmp-status .run-progress", timeout=30_000)
    page.wait_for_selector("#cmp-table table", timeout=180_000)
    table = page.inner_text("#cmp-table")
    for text in ("B / A", "baseline / A", "TTFT", "TPOT", "output throughput", "weights", "KV cache allocated",
                 "peak memory", "prefix-cache hit rate", "speculative acceptance", "perplexity"):
        assert text in table, text
    perplexities = page.eval_on_selector_all("#cmp-table td[data-key=perplexity]",
                                             "cells => cells.map(c => c.innerText)")
    assert len(perplexities) == 3 and all(cell.strip() != "n/a" for cell in perplexities)
    columns = page.locator("#cmp-outputs .cmp-output")
    assert columns.count() == 6, "two prompts, three columns each"
    assert all(columns.nth(i).locator(".cmp-text").inner_text().strip() for i in range(6))
    assert page.locator("#cmp-outputs .cmp-output[data-side=B] .tok-diff").count() > 0, "pooled KV heads change text"
    assert "differs from A" in page.inner_text("#cmp-outputs .cmp-output[data-side=B]")
    assert page.locator("#cmp-outputs .cmp-output[data-side=baseline] .tok-diff").count() == 0
    for chart in ("#cmp-chart-run_throughput", "#cmp-chart-run_batch", "#cmp-chart-run_kv"):
        assert lines_drawn(page, chart) == ["A", "B", "baseline"]
        assert_axes_readable(page, chart)
    tall_screenshot(page, shots / "compare.png", 2000)


def test_chat_with_both_streams_a_reply_in_each_column(page):
    """Two questions, so that each column scrolls: its label stays clear of the messages scrolled under it."""
    open_tab(page, "Compare")
    page.locator("#cmp-chat > .label-wrap").click()
    for turn, question in enumerate(("What does the json module do?", "And the os module?"), start=1):
        fill_text(page, "#cmp-message", question)
        page.locator("#cmp-send").click()
        page.wait_for_function(" && ".join(f"document.querySelectorAll('#cmp-chat-{side} [data-testid=bot]').length "
                                           f">= {turn}" for side in ("a", "b", "baseline"))
                               + " && !document.querySelector('#cmp-chat .msg-figures.live')", timeout=120_000)
    page.wait_for_timeout(500)
    for column in ("#cmp-chat-a", "#cmp-chat-b", "#cmp-chat-baseline"):
        assert "engine TTFT" in page.inner_text(column), column
        layout = page.evaluate(CHAT_LAYOUT, column)
        assert layout["label"] and not layout["overlaps"], f"{column}: its label covers a message: {layout}"
        assert layout["gaps"] and min(layout["gaps"]) >= 4, f"{column}: the reply's figures run together: {layout}"


# A chat column's label, whether it covers a message, and the gap between each figure chip and the one before it
# (beside it on the same row, or above it).
CHAT_LAYOUT = """column => {
    const box = e => e.getBoundingClientRect(), root = document.querySelector(column);
    const label = root.querySelector('[data-testid=block-label]');
    const view = box(root.querySelector('[role=log]'));  // the messages scroll inside it: what shows of each
    const messages = [...root.querySelectorAll('[data-testid=bot], [data-testid=user]')].map(box).map(m => ({
        left: m.left, right: m.right, top: Math.max(m.top, view.top), bottom: Math.min(m.bottom, view.bottom)}));
    const l = label && box(label);
    const overlaps = !!l && messages.some(m => m.left < l.right && l.left < m.right && m.top < l.bottom
                                                && l.top < m.bottom);
    const chips = [...root.querySelectorAll('.msg-figures .fig')].map(box), gaps = [];
    for (let i = 1; i < chips.length; i++)
        gaps.push(Math.abs(chips[i].top - chips[i - 1].top) < 2 ? chips[i].left - chips[i - 1].right
                                                                : chips[i].top - chips[i - 1].bottom);
    return {label: label && label.textContent.trim(), overlaps, gaps}; }"""


def test_compare_with_a_surge_adds_the_prompts_gaps_during_it_to_the_table(page, shots):
    """The surge box sends each side long prompts into its replies; the table gains the prompts' p99 token gap
    during the surge and outside it, and the surge's p99 TTFT, with B / A."""
    open_compare_with_b(page, "max_num_batched_tokens=32")
    assert "half streamed" in page.get_attribute("#cmp-surge", "title")
    pick(page, "#cmp-baseline", "none")  # the page may keep an earlier test's choices
    page.locator("#cmp-perplexity input").uncheck()
    fill_text(page, "#cmp-surge", "3:96:4")
    page.locator("#cmp-run").click()
    # an earlier comparison's table (without a surge) may still be shown: wait for this one's
    page.wait_for_function("document.querySelector('#cmp-table')?.innerText.includes('during the surge')",
                           timeout=180_000)
    table = page.inner_text("#cmp-table")
    for text in ("token gap during the surge", "token gap outside it", "surge p99 TTFT", "surge requests completed"):
        assert text in table, text
    gaps = page.eval_on_selector_all("#cmp-table td[data-key=chat_p99_itl_during_surge_ms]",
                                     "cells => cells.map(c => c.innerText)")
    assert len(gaps) == 2 and all(cell.strip() not in ("", "n/a", "—") for cell in gaps)
    tall_screenshot(page, shots / "compare-surge.png", 1900)


def test_benchmark_runs_with_progress_cancels_exports_and_overlays(served, page, shots):
    open_tab(page, "Benchmark")
    page.wait_for_selector("#bench-run", state="visible")
    assert "Poisson" in page.get_attribute("#bench-rate", "title")
    page.fill("#bench-requests input", "64")
    fill_text(page, "#bench-output", "256")
    page.locator("#bench-run").click()
    page.wait_for_function("document.querySelector('#bench-status .progress-detail') && document.querySelector("
                           "'#bench-status .progress-detail').innerText.includes('requests done')", timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#bench-chart-run_throughput polyline').length > 0",
                           timeout=60_000)
    page.locator("#bench-cancel").click()
    page.wait_for_function("document.querySelector('#bench-status').innerText.includes('cancelled')",
                           timeout=120_000)
    assert "of 64 requests finished" in page.inner_text("#bench-status")
    app = served[0]
    assert all(entry.engine.stats().num_running == 0 for entry in app.pool.entries())

    page.fill("#bench-requests input", "24")
    fill_text(page, "#bench-output", "16:64")
    page.locator("#bench-run").click()
    page.wait_for_function("document.querySelector('#bench-status').innerText.includes('run 2 done')",
                           timeout=180_000)
    page.fill("#bench-prefix input", "32")
    page.fill("#bench-slo-ttft input", "500")
    page.fill("#bench-seed input", "1")
    page.locator("#bench-run").click()
    page.wait_for_function("document.querySelector('#bench-status').innerText.includes('run 3 done')",
                           timeout=180_000)
    table = page.inner_text("#bench-table")
    for text in ("TTFT", "TPOT", "ITL", "E2EL", "p99", "goodput", "TTFT ≤ 500 ms", "request throughput",
                 "prefix-cache hit rate", "speculative acceptance"):
        assert text in table, text
    with page.expect_download() as download:
        page.locator("#bench-json").click()
    report = json.loads(open(download.value.path(), encoding="utf-8").read())
    assert report["completed"] == 24 and report["workload"]["prefix_len"] == 32 and "p99_itl_ms" in report
    with page.expect_download() as download:
        page.locator("#bench-csv").click()
    assert open(download.value.path(), encoding="utf-8").read().count("\n") == 4, "a header and three runs"

    page.locator("#bench-overlay label", has_text="run 2").click()
    page.wait_for_function("document.querySelectorAll('#bench-chart-run_batch polyline').length == 2",
                           timeout=10_000)
    assert lines_drawn(page, "#bench-chart-run_kv") == ["run 2", "run 3"]
    assert_axes_readable(page, "#bench-chart-run_kv")
    history = page.inner_text("#bench-history")
    assert "run 2" in history and "run 3" in history and "×" in history
    tall_screenshot(page, shots / "benchmark.png", 1750)


def test_glossary_and_tooltips_explain_every_toggle_and_figure(page):
    open_tab(page, "Glossary")
    text = page.inner_text("#glossary")
    assert "first output token time - arrival" in text and "(E2EL - TTFT) / (output tokens - 1)" in text
    for term in ("prefix_caching", "kv_layout", "speculative", "quantization", "goodput", "perplexity"):
        assert term in text, term
    for element in ("ctl-prefix_caching", "ctl-kv_layout", "ctl-quantization", "temperature", "bench-prefix"):
        assert page.get_attribute(f"#{element}", "title"), element


def test_a_narrow_screen_keeps_the_tabs_usable(served, browser):
    narrow = open_page(browser, served[1], width=400, height=860)
    try:
        open_tab(narrow, "Compare")
        narrow.wait_for_selector("#cmp-run", state="visible")
        a, b = narrow.locator("#cmp-a-source").bounding_box(), narrow.locator("#cmp-b-source").bounding_box()
        assert b["y"] > a["y"] + a["height"] - 1, "A and B stack on a narrow screen"
        assert narrow.evaluate("document.documentElement.scrollWidth") <= 410, "the page scrolls sideways"
        assert narrow.locator("#tabs").bounding_box()["y"] < narrow.locator("#engine-panel").bounding_box()["y"]
    finally:
        narrow.close()
