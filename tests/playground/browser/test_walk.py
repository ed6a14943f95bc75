"""A walk of the whole playground in a real headless Chromium that fails on what the browser console reports.

Every tab at 1400 px and at 400 px wide (a screenshot of each at 400 px goes to PLAYGROUND_SCREENSHOT_DIR when
set; the wide tabs have theirs from the tab tests), then every preset and every quantization, GQA, speculative and
tensor-parallel choice this host offers, each applied from the panel and asked one short question, its reply
labelled with its whole configuration. Any console error, uncaught script error or console warning fails the walk,
except the allow-listed warnings below, each outside the project's control. The demo model and short replies keep
it to a few minutes on two cores.
"""

from __future__ import annotations

import json
import re

import pytest

from engine import unavailable_reason
from engine.presets import list_presets
from playground.engine_panel.choices import usable_choices
from tests.playground.browser.actions import (
    BROWSER_MARKS,
    MARK_STATUS,
    assert_axes_readable,
    open_page,
    open_tab,
    pick,
    wait_applied,
)

pytestmark = BROWSER_MARKS

# Each tab, and what shows once it has drawn.
TABS = {"Chat": "#chat", "Compare": "#cmp-run", "Benchmark": "#bench-run", "Roofline": "#rl-probe",
        "Glossary": "#glossary"}
# What else a tab's walk opens, so that its folded controls show too.
UNFOLD = {"Compare": "#cmp-chat > .label-wrap"}
# The visible labels (shown, or read out by a screen reader) that Gradio gives a control nobody named.
UNNAMED = """() => [...document.querySelectorAll('[data-testid=block-info], [data-testid=block-label]')]
    .filter(label => label.closest('.block') && label.closest('.block').offsetParent !== null)
    .map(label => label.textContent.trim())
    .filter(text => ['Textbox', 'Number', 'Slider', 'Dropdown', 'Checkbox', 'Radio', 'Chatbot', 'HTML']
        .includes(text))"""
# The shown sliders whose minimum, track and maximum overflow their row (the maximum shows cut, "51" for 512).
CUT_SLIDERS = """() => [...document.querySelectorAll('.slider_input_container')]
    .filter(row => row.offsetParent !== null && row.scrollWidth > row.clientWidth + 1)
    .map(row => row.closest('.block').id)"""
WIDEST_TABLE = """() => Math.max(0, ...[...document.querySelectorAll('table')].filter(t => t.offsetParent !== null)
    .map(t => t.getBoundingClientRect().right))"""
# Console warnings the project cannot act on: pattern -> reason (none today; a warning matching none fails the walk).
ALLOWED_WARNINGS: dict[str, str] = {}


class Console:
    """What a page printed to its console and the script errors it raised, from before it loaded."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))

    def _message(self, message) -> None:
        allowed = any(re.search(pattern, message.text) for pattern in ALLOWED_WARNINGS)
        if message.type == "error" or (message.type == "warning" and not allowed):
            self.problems.append(f"{message.type}: {message.text[:300]}")

    def assert_clean(self) -> None:
        assert not self.problems, f"{len(self.problems)} console problems, first: {self.problems[:5]}"


@pytest.fixture(scope="module")
def walked(served, browser):
    """One wide page for the panel walk, with its console."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = Console(page)
    open_page(browser, served[1], page=page)
    yield page, console
    page.close()


@pytest.mark.parametrize("width", [1400, 400])
def test_every_tab_shows_at_wide_and_narrow_widths(served, browser, shots, width):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    console = Console(page)
    try:
        open_page(browser, served[1], page=page)
        for tab, shown in TABS.items():
            assert page.get_by_role("tab", name=tab).is_visible(), f"the {tab} tab is hidden at {width} px"
            open_tab(page, tab)
            page.wait_for_selector(shown, state="visible", timeout=15_000)
            if tab in UNFOLD:  # a new page: folded
                page.click(UNFOLD[tab])
            page.wait_for_timeout(300)
            if width == 400:
                page.screenshot(path=str(shots / f"narrow-{tab.lower()}.png"))
            assert page.evaluate("document.documentElement.scrollWidth") <= width + 10, f"{tab} scrolls sideways"
            assert not page.evaluate(UNNAMED), f"{tab}: controls without a name"
            assert not page.evaluate(CUT_SLIDERS), f"{tab}: sliders cut at their ends"
            assert page.evaluate(WIDEST_TABLE) <= width, f"{tab}: a table runs past the window's right edge"
        console.assert_clean()
    finally:
        page.close()


LAST_TURN = "(document.querySelector('#chart-ttft .hrow:last-of-type') || {dataset: {turn: 0}}).dataset.turn"


# The label of the TTFT chart's newest row ("#N config ..."), or "" before any.
LAST_TTFT_LABEL = "(Array.from(document.querySelectorAll('#chart-ttft .hrow .hlabel')).pop()?.innerText ?? '')"


def ask(page) -> str:
    """Clear the chat, send a short question and return the label of its TTFT row once the reply finished."""
    page.click("#clear")
    page.wait_for_function("document.querySelectorAll('#chat [data-testid=bot]').length == 0", timeout=30_000)
    turn = page.evaluate(LAST_TURN)
    last_row = page.evaluate(LAST_TTFT_LABEL)
    page.fill("#message textarea", "What is a KV block?")
    page.press("#message textarea", "Enter")
    page.wait_for_function(f"{LAST_TURN} > {turn} && "
                           "!document.querySelector('#chat .thinking, #chat .msg-figures.live')", timeout=90_000)
    # The chart refreshes apart from the reply (a loaded machine shows the reply first): wait for this reply's row.
    page.wait_for_function(f"{LAST_TTFT_LABEL} !== {json.dumps(last_row)}", timeout=30_000)
    return page.evaluate(LAST_TTFT_LABEL)


def apply_and_ask(page) -> str:
    """Apply the panel, ask, and return the configuration that labels the reply's TTFT row."""
    page.wait_for_selector("#check .check.ok", timeout=10_000)
    page.evaluate(MARK_STATUS)
    page.click("#apply")
    status = wait_applied(page)
    assert re.match("Loaded|Sharing", status), status
    return re.sub(r"^#\d+ | · prompt \d+ tok.*$", "", ask(page))


def test_every_preset_applies_cleanly(served, walked):
    page, console = walked
    page.set_default_timeout(15_000)
    for preset in list_presets():
        pick(page, "#preset", preset)
        status = wait_applied(page)
        assert re.match("Loaded|Sharing", status), f"{preset}: {status}"
        if preset.startswith("speculative"):
            label = ask(page)
            assert "spec" in label, label
    console.assert_clean()


def test_every_choice_the_host_offers_applies_cleanly(walked):
    """Each choice from the defaults (the continuous preset), then back, so each is applied on its own; each reply's
    label names its configuration, so no two are the same."""
    page, console = walked
    pick(page, "#preset", "continuous")
    wait_applied(page)
    # The first choice is clicked only once the preset's value is in the form, so that no late update undoes it.
    page.wait_for_selector('#ctl-quantization input[value="none"]:checked', state="attached", timeout=30_000)
    labels = {}
    for value in usable_choices("quantization")[1:]:
        page.locator(f'#ctl-quantization input[value="{value}"]').click()
        labels[f"quantization={value}"] = apply_and_ask(page)
    page.locator('#ctl-quantization input[value="none"]').click()

    page.locator("#engine-panel button", has_text="Speculative decoding").click()
    for value in ("ngram", "draft"):
        if not unavailable_reason("speculative", value):
            page.locator(f'#ctl-speculative input[value="{value}"]').click()
            labels[f"speculative={value}"] = apply_and_ask(page)
            page.wait_for_selector("#chart-spec_chart svg", state="visible", timeout=10_000)
            assert_axes_readable(page, "#chart-spec_chart")
    page.locator('#ctl-speculative input[value="off"]').click()

    page.locator("#engine-panel button", has_text="Attention heads, parallelism, advanced").click()
    for field in ("gqa", "tensor_parallel_size"):
        choices = [str(value) for value in usable_choices(field)]
        for value in choices[1:]:
            pick(page, f"#ctl-{field}", value)
            labels[f"{field}={value}"] = apply_and_ask(page)
        pick(page, f"#ctl-{field}", choices[0])
    assert len(set(labels.values())) == len(labels), f"choices with the same label: {labels}"
    console.assert_clean()
