"""Structured output and token probabilities in the chat, in a real headless Chromium (as test_chat_and_panel.py
drives the chat): "show token probabilities" gives a reply of shaded tokens whose tooltip lists the alternatives.
Screenshots go to PLAYGROUND_SCREENSHOT_DIR when set (docs/playground.md's images are made that way)."""

from __future__ import annotations

from tests.playground.browser.actions import BROWSER_MARKS

pytestmark = BROWSER_MARKS


def send_and_wait(page, text: str) -> None:
    before = page.locator("#chat .msg-figures:not(.live)").count()
    page.fill("#message textarea", text)
    page.press("#message textarea", "Enter")
    try:
        page.wait_for_function(f"document.querySelectorAll('#chat .msg-figures:not(.live)').length > {before}",
                               timeout=120_000)
    except Exception as error:  # say what the page showed instead
        raise AssertionError(f"no reply: notice {page.inner_text('#chat-notice')!r}, chat "
                             f"{page.inner_text('#chat')[-300:]!r}") from error


def last_reply(page):
    return page.locator('#chat [data-testid="bot"]').last


def test_token_probabilities_show_each_tokens_alternatives_on_hover(page, shots):
    page.locator("#token-probs input").check()
    send_and_wait(page, "What does the json module do?")
    tokens = last_reply(page).locator(".tokens .tok")
    assert tokens.count() > 3
    token = tokens.nth(2)
    tip = token.locator(".tok-tip")
    assert not tip.is_visible()
    token.hover()
    tip.wait_for(state="visible", timeout=5_000)
    lines = tip.inner_text().splitlines()
    assert lines[0].endswith("%") and lines[1] == "top alternatives" and len(lines) == 7, lines
    assert page.locator("#chat .token-legend").last.is_visible()
    page.locator("#chat").screenshot(path=str(shots / "chat-structured-and-tokens.png"))
