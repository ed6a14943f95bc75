"""What the browser tests do on the page, shared by their modules: open the page, pick from a dropdown, wait for
Apply, open a tab, type as a person does, take a tall screenshot; and the marks every browser test carries.

Playwright drives the system's Chromium (/usr/bin/chromium); it never downloads a browser here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium at /usr/bin/chromium"),
]
MARK_STATUS = "() => document.querySelectorAll('#apply-status .apply-status').forEach(e => e.dataset.old = '1')"


def open_page(browser, url, width=1600, height=1000, page=None):
    """Load the playground in `page` (by default a new one of that size) and wait for its engine pool."""
    page = page or browser.new_page(viewport={"width": width, "height": height}, accept_downloads=True)
    page.goto(url)
    page.wait_for_selector("#chat", timeout=30_000)
    page.wait_for_function("document.querySelector('#pool') && document.querySelector('#pool').innerText"
                           ".includes('Engine pool')", timeout=30_000)
    return page


def pick(page, dropdown: str, option: str) -> None:
    page.evaluate(MARK_STATUS)
    page.click(f"{dropdown} input")
    page.click(f'[role=option][aria-label="{option}"]')


def wait_applied(page) -> str:
    """After Apply or a preset (the old status marked by MARK_STATUS before it): the new final status."""
    page.wait_for_selector("#apply-status .apply-status.ok:not([data-old]), "
                           "#apply-status .apply-status.bad:not([data-old])", timeout=90_000)
    return page.inner_text("#apply-status .apply-status")


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def fill_text(page, textbox: str, text: str) -> None:
    """Type into a Gradio textbox as a person does (its input event fires)."""
    box = page.locator(f"{textbox} textarea, {textbox} input").first
    box.fill(text)
    box.press("Tab")


def tall_screenshot(page, path, height: int) -> None:
    """The page from its top in a window `height` pixels tall (a tab's whole run), then the usual window again."""
    page.set_viewport_size({"width": 1440, "height": height})
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(300)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1440, "height": 1000})


AXIS_TITLES = """chart => [...document.querySelectorAll(chart + ' svg text.axis')].map(t => {
    const r = t.getBoundingClientRect(), box = document.querySelector(chart).getBoundingClientRect();
    const [red, green, blue] = getComputedStyle(t).fill.match(/\\d+/g).map(Number);
    return {text: t.textContent, height: r.height, inside: r.left >= box.left && r.top >= box.top &&
            r.right <= box.right && r.bottom <= box.bottom, lightness: (red + green + blue) / 3}; })"""


def assert_axes_readable(page, chart: str) -> None:
    """Both axis titles of a line chart are drawn whole inside its box, dark, in a font of about 10 px or more (a
    text box at least 11 px high)."""
    titles = page.evaluate(AXIS_TITLES, chart)
    assert len(titles) == 2, f"{chart}: axis titles {titles}"
    for title in titles:
        assert title["text"] and title["inside"], f"{chart}: clipped {title}"
        assert title["height"] >= 11 and title["lightness"] < 110, f"{chart}: hard to read {title}"


def finished_replies(page) -> int:
    return page.locator("#chat .msg-figures:not(.live)").count()


def send(page, text: str, press_enter: bool = True) -> None:
    """Send a message and wait for its reply to finish."""
    before = finished_replies(page)
    page.fill("#message textarea", text)
    if press_enter:
        page.press("#message textarea", "Enter")
    else:
        page.click("#send")
    try:
        page.wait_for_function(f"document.querySelectorAll('#chat .msg-figures:not(.live)').length > {before}",
                               timeout=120_000)
    except Exception as error:  # say what the page showed instead
        raise AssertionError(f"no reply to {text!r}: notice {page.inner_text('#chat-notice')!r}, chat "
                             f"{page.inner_text('#chat')[-300:]!r}") from error
