"""Fixtures of the browser tests: one headless Chromium per module, the screenshots' folder, and the app and page
the tab tests share (the chat and engine panel tests start their own, with the model's example questions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from playground.shared.settings import Settings
from tests.playground.browser.actions import CHROMIUM, CHROMIUM_ARGS, open_page
from tests.support.ui_helpers import pick_model, start_app


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where screenshots go: PLAYGROUND_SCREENSHOT_DIR when set (the README's images are made that way), else a
    temporary folder."""
    folder = Path(os.environ.get("PLAYGROUND_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on the picked model, as (context, url)."""
    app, demo, url = start_app(pick_model(tmp_path_factory), Settings(max_new_tokens=256, max_prompt_tokens=400,
                                                                      max_queue=8))
    yield app, url
    demo.close()
    app.pool.close()


@pytest.fixture(scope="module")
def page(served, browser):
    page = open_page(browser, served[1], width=1440, height=1000)
    yield page
    page.close()
