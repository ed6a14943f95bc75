"""The Roofline tab and the chat tab's quality panel in a real headless Chromium (as test_chat_and_panel.py does).

A person's path: open the Roofline tab, run the probe, read the chart (the roof, the ridge, prefill and decode at
each batch size), the verdict and what the same steps would take on the GPUs of the what-if table; in the chat
tab, measure the perplexity beside the weights. The screenshot of the
tab goes to PLAYGROUND_SCREENSHOT_DIR when set (the README's image is made that way), else to a temporary folder.
"""

from __future__ import annotations

import re

import pytest

from tests.playground.browser.actions import BROWSER_MARKS, open_tab, pick, tall_screenshot, wait_applied

pytestmark = BROWSER_MARKS


def test_roofline_tab_probes_and_places_prefill_and_decode(page, shots):
    open_tab(page, "Roofline")
    page.wait_for_selector("#rl-probe", state="visible")
    assert "4, then 16" in page.get_attribute("#rl-probe", "title")
    page.locator("#rl-probe").click()
    page.wait_for_selector("#rl-chart .rl-point[data-phase='decode, batch 16']", timeout=180_000)
    phases = page.eval_on_selector_all("#rl-chart .rl-point", "points => points.map(p => p.dataset.phase)")
    assert set(phases) == {"prefill", "decode, batch 1", "decode, batch 4", "decode, batch 16"}
    intensity = dict(zip(phases, page.eval_on_selector_all(
        "#rl-chart .rl-point", "points => points.map(p => parseFloat(p.dataset.intensity))"), strict=True))
    assert intensity["decode, batch 1"] < intensity["decode, batch 4"] < intensity["decode, batch 16"]
    assert intensity["prefill"] > intensity["decode, batch 16"]
    summary = page.inner_text("#rl-summary")
    assert "prefill (" in summary and "decode (" in summary and "of its ceiling" in summary
    assert ("memory-bound" in summary or "neither bound: overhead" in summary) and "matmul peak" in summary
    assert page.locator("#rl-chart polyline.rl-roof").count() == 1
    tall_screenshot(page, shots / "roofline.png", 1250)
    # what-if hardware: the same steps on every device of the table, marked as estimates, the H200 checked
    table = page.locator("#projection-table table.pj-table")
    table.scroll_into_view_if_needed()
    assert table.is_visible() and page.locator("#projection-chart g.pj-bar").count() == 7
    rows = page.eval_on_selector_all("#projection-table tr.pj-row", "rows => rows.map(r => r.dataset.device)")
    assert len(rows) == 7 * 4 and "NVIDIA H200" in rows and rows[0].endswith("(measured here)")
    text = page.inner_text("#rl-projection")
    assert "estimates, not measurements" in text and "checked on its committed run" in text
    assert "TPOT at batch 16" in text
    page.locator("#rl-projection").screenshot(path=str(shots / "roofline-what-if.png"))


def test_quality_panel_measures_perplexity_beside_the_weights(page):
    open_tab(page, "Chat")
    page.wait_for_function("document.querySelector('#chart-features').innerText.includes('not measured yet')",
                           timeout=30_000)
    assert "weights" in page.inner_text("#chart-features")
    page.locator("#measure-ppl").click()
    page.wait_for_function("/\\d+\\.\\d{3} on [\\d,]+ tokens/.test("
                           "document.querySelector('#chart-features').innerText)", timeout=180_000)


def test_quantization_and_gqa_show_their_memory_and_quality_cost(page, shots):
    """nf4 weights and 4 KV heads applied from the panel: the quality panel gives the weights before and after
    quantization and the perplexity of the loaded configuration; the memory chart shows the smaller KV pool."""
    open_tab(page, "Chat")
    page.locator("#ctl-quantization label", has_text="nf4").click()
    page.get_by_text("Attention heads, parallelism, advanced").click()  # a closed group of the panel
    pick(page, "#ctl-gqa", "4")
    page.click("#apply")
    assert "Loaded" in wait_applied(page)
    assert "nf4" in page.inner_text("#header") and "GQA 4" in page.inner_text("#header")
    page.wait_for_function("document.querySelector('#chart-features').innerText.includes('before quantization')",
                           timeout=30_000)
    weights = page.inner_text("#chart-features")
    ratio = float(re.search(r"as nf4 \((\d\.\d+)x\)", weights).group(1))
    assert 0.2 < ratio < 0.45, weights
    page.locator("#measure-ppl").click()
    # done when this engine's figure stands beside the float32 reference (a chart refresh shows the figure alone
    # first, and the click briefly brings back the panel this button last produced, the float32 engine's)
    page.wait_for_function("(t => /float32 reference [\\d.]+ \\([\\d.]+x\\)/.test(t) && t.includes('as nf4'))("
                           "document.querySelector('#chart-features').innerText)", timeout=180_000)
    quality = page.inner_text("#chart-features")
    measured, reference, ratio = re.search(r"([\d.]+) on [\d,]+ tokens.*float32 reference ([\d.]+) \(([\d.]+)x\)",
                                           quality, re.S).groups()
    # this engine's figure, not the reference engine's: 4 pooled KV heads roughly double the demo's perplexity
    assert float(ratio) > 1.5 and float(measured) == pytest.approx(float(ratio) * float(reference), rel=0.01), quality
    assert "as nf4" in quality, quality
    page.locator("#chart-features").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "quantization-gqa.png"))
