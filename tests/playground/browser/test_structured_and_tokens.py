"""Structured output and token probabilities in the chat, in a real headless Chromium (as test_chat_and_panel.py
drives the chat): a JSON schema set in the chat's settings gives a reply with its validity line and the mask's cost
among its figures; "show token probabilities" gives a reply of shaded tokens whose tooltip lists the alternatives.
Screenshots go to PLAYGROUND_SCREENSHOT_DIR when set (docs/playground.md's images are made that way)."""

from __future__ import annotations

import json

from tests.playground.browser.actions import BROWSER_MARKS, fill_text, pick, send

pytestmark = BROWSER_MARKS

SCHEMA = {"type": "object", "properties": {"module": {"type": "string", "maxLength": 16},
                                           "in_stdlib": {"type": "boolean"}},
          "required": ["module", "in_stdlib"], "additionalProperties": False}


def last_reply(page):
    return page.locator('#chat [data-testid="bot"]').last


def test_a_json_schema_reply_shows_its_validity_and_the_masks_cost(page):
    pick(page, "#structured", "JSON schema")
    fill_text(page, "#structured-spec", "{not json")
    page.fill("#message textarea", "Which module reads JSON?")
    page.press("#message textarea", "Enter")
    page.wait_for_function("document.querySelector('#chat-notice').innerText.includes('not valid JSON')",
                           timeout=30_000)
    assert page.input_value("#message textarea") == "Which module reads JSON?", "the refused message stays in the box"
    assert page.locator('#chat [data-testid="bot"]').count() == 0, "nothing entered the conversation"

    fill_text(page, "#structured-spec", json.dumps(SCHEMA))
    send(page, "Which module reads JSON?")
    reply = last_reply(page)
    validity = reply.locator(".reply-validity")
    assert validity.inner_text() == "✓ valid against the schema", reply.inner_text()
    answer = json.loads(reply.inner_text().split("✓")[0])
    assert set(answer) == {"module", "in_stdlib"}
    mask = reply.locator(".fig", has_text="guided mask").inner_text()
    assert "ms/tok" in mask and "of TPOT" in mask, mask


def test_token_probabilities_show_each_tokens_alternatives_on_hover(page, shots):
    """(After the schema reply: the screenshot shows both, docs/playground.md's image.)"""
    pick(page, "#structured", "off")
    page.locator("#token-probs input").check()
    send(page, "What does the json module do?")
    page.set_viewport_size({"width": 1440, "height": 1150})  # a chat box tall enough for both replies
    page.evaluate("window.scrollTo(0, 0)")
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
    # clipped from the page as it is (an element screenshot scrolls first, which moves the token from under the mouse)
    page.screenshot(path=str(shots / "chat-structured-and-tokens.png"), clip=page.locator("#chat").bounding_box())
    page.set_viewport_size({"width": 1440, "height": 1000})
