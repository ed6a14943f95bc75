"""A model served elsewhere, as a person reaches it in the browser: the panel's "Served elsewhere" group names this
app's own /v1 running in a second process, Apply loads it, and the chat streams its reply with the figures labelled as
this client's. The screenshot (assets/screenshots/served-elsewhere.png when PLAYGROUND_SCREENSHOT_DIR is set) shows
the panel and the reply."""

from __future__ import annotations

import pytest

from tests.playground.browser.actions import BROWSER_MARKS, MARK_STATUS, send, wait_applied
from tests.support.ui_helpers import app_process

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def second_app():
    with app_process() as url:
        yield f"{url}/v1"


def test_the_chat_streams_from_a_model_served_by_another_server(served, page, shots, second_app):
    app, _ = served
    page.get_by_text("Served elsewhere (backend=remote)").click()
    page.locator("#ctl-backend label", has_text="remote").click()
    # typed key by key, as a person does: the check line follows each keystroke
    page.locator("#ctl-remote_url textarea").press_sequentially(second_app, delay=5)
    page.locator("#ctl-remote_model textarea").press_sequentially("demo", delay=5)
    page.wait_for_function("document.querySelector('#check').innerText.includes('model demo')", timeout=15_000)
    assert second_app in page.inner_text("#check")
    page.evaluate(MARK_STATUS)
    page.click("#apply")
    assert "Loaded" in wait_applied(page)
    assert "figures measured at this client" in page.inner_text("#header")
    send(page, "What does the json module do?")
    figures = page.locator("#chat .msg-figures:not(.live)").last.inner_text()
    assert "client TTFT" in figures and "engine TTFT" not in figures
    assert "ms client" in page.inner_text("#chart-ttft")
    page.wait_for_function("document.querySelector('#features-chart').innerText.includes('publishes no Prometheus')",
                           timeout=10_000)  # this app's /v1 has no /metrics page, and the panel says so
    assert "not visible from this client" in page.inner_text("#memory-chart")
    assert any(entry.key.backend == "remote" and entry.key.remote_url == second_app
               for entry in app.pool.entries())
    page.screenshot(path=str(shots / "served-elsewhere.png"))
