"""The playground in a real headless Chromium (the system's /usr/bin/chromium, driven by Playwright).

Loads the page, sends a message, watches the reply stream in, reads the reply's own figures and
checks that a chart changed. Screenshots go to a temporary folder, or to PLAYGROUND_SCREENSHOT_DIR
when set (the README's images in assets/screenshots/ are made that way).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from playground.settings import Settings

try:
    from test_ui_api import pick_model, start_app
except ImportError:  # tests imported as a package
    from tests.test_ui_api import pick_model, start_app

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium at /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = pick_model(tmp_path_factory)
    app, demo, url = start_app(model, Settings(max_new_tokens=48, max_prompt_tokens=400, max_queue=8))
    yield app, url
    demo.close()
    app.pool.close()


@pytest.fixture(scope="module")
def page(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(served[1])
        page.wait_for_selector("#chat", timeout=30_000)
        yield page
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("PLAYGROUND_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# Records every distinct text of the last assistant bubble, to see that the reply streams in.
WATCH_REPLY = """() => {
  window.__replyTexts = [];
  const chat = document.querySelector('#chat');
  new MutationObserver(() => {
    const bots = chat.querySelectorAll('.message.bot, [data-testid="bot"]');
    const last = bots[bots.length - 1];
    if (!last || last.querySelector('.thinking')) return;
    const text = last.innerText.split('TTFT')[0].trim();
    const seen = window.__replyTexts;
    if (text && seen[seen.length - 1] !== text) seen.push(text);
  }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


def test_chat_streams_with_figures_and_charts_move(served, page, shots):
    app, _ = served
    page.wait_for_function("document.querySelector('#header').innerText.includes('Inference Playground')")
    header = page.inner_text("#header")
    assert ("CPU:" in header or "GPU:" in header) and "continuous" in header
    page.wait_for_function(
        "document.querySelector('#pool') && document.querySelector('#pool').innerText.includes('Engine pool')")
    ttft_before = page.locator("#chart-ttft").screenshot()

    page.evaluate(WATCH_REPLY)
    page.fill("#message textarea", "What does the KV cache store, and why does paging it help?")
    page.click("#send")
    page.wait_for_selector("#chat .msg-figures:not(.live) .fig", timeout=60_000)
    page.wait_for_timeout(800)  # let the last chart update land

    texts = page.evaluate("window.__replyTexts")
    assert len(texts) >= 2 and len(texts[-1]) > len(texts[0]), f"the reply did not stream: {texts}"
    figures = page.inner_text("#chat .msg-figures:not(.live)")
    for label in ("TTFT", "decode", "prompt", "output", "cached"):
        assert label in figures
    ttft_after_one = page.locator("#chart-ttft").screenshot()
    assert ttft_after_one != ttft_before, "the TTFT chart did not change"

    # A second turn: its prompt repeats the first turn, so the figures show cached prompt tokens.
    page.fill("#message textarea", "How does prefix caching reuse it?")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('#chat .msg-figures:not(.live)').length >= 2", timeout=60_000)
    page.wait_for_timeout(2500)  # a timer refresh of the charts
    page.screenshot(path=str(shots / "playground.png"))
    assert page.locator("#chart-ttft").screenshot() != ttft_after_one, "the TTFT chart did not add the turn"


def test_impossible_combination_is_refused_with_its_reason(page, shots):
    page.get_by_text("KV cache", exact=True).first.scroll_into_view_if_needed()
    page.locator("#engine-panel label", has_text="contiguous").first.click()
    page.wait_for_selector("#check .check.bad", timeout=10_000)
    assert "prefix_caching" in page.inner_text("#check")
    assert page.locator("#apply").is_disabled()
    page.locator("#engine-panel").screenshot(path=str(shots / "engine-panel-refused.png"))
    page.locator("#engine-panel label", has_text="paged").first.click()
    page.wait_for_selector("#check .check.ok", timeout=10_000)
    assert page.locator("#apply").is_enabled()
