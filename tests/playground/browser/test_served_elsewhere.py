"""A model served elsewhere, as a person reaches it in the browser: the panel's "Served elsewhere" group names a
server in a second process (llama.cpp's own server, then this app's /v1), Apply loads it, and the chat streams its
reply with the figures labelled as this client's. The screenshot of this app's /v1
(assets/screenshots/served-elsewhere.png when PLAYGROUND_SCREENSHOT_DIR is set) shows the panel and the reply."""

from __future__ import annotations

import pytest

from engine.host import llama_cpp_available
from tests.playground.browser.actions import BROWSER_MARKS, MARK_STATUS, send, wait_applied
from tests.support.llama_cpp_server import llama_cpp_server
from tests.support.ui_helpers import app_process

pytestmark = BROWSER_MARKS


LLAMA_CPP, THIS_APP = "llama.cpp's server", "this app's /v1"


@pytest.fixture(scope="module", params=[LLAMA_CPP, THIS_APP])
def server(request) -> tuple[str, str]:
    """(which, its /v1 base URL): a server in a second process serving the demo model as "demo"."""
    if request.param == LLAMA_CPP:
        if not llama_cpp_available():
            pytest.skip("llama-cpp-python is not installed (`make test` installs it)")
        with llama_cpp_server() as base:
            yield LLAMA_CPP, base
    else:
        with app_process() as url:
            yield THIS_APP, f"{url}/v1"


def test_the_chat_streams_from_a_model_served_by_another_server(served, page, shots, server):
    app, _ = served
    which, second_app = server
    page.reload()
    page.wait_for_selector("#chat", timeout=30_000)
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
                           timeout=10_000)  # neither server has a /metrics page, and the panel says so
    assert "not visible from this client" in page.inner_text("#memory-chart")
    assert any(entry.key.backend == "remote" and entry.key.remote_url == second_app
               for entry in app.pool.entries())
    if which == THIS_APP:
        page.screenshot(path=str(shots / "served-elsewhere.png"))
