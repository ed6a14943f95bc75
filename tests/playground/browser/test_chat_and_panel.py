"""The playground in a real headless Chromium (the system's /usr/bin/chromium, driven by Playwright).

Each visible promise of the page is checked the way a person meets it: replies stream with the
engine's TTFT and the wait from Enter labelled apart; presets are applied as written and the engine
that gets loaded has exactly the panel's values; the check line, the chat's own icons (trash,
retry, undo, edit), exports, a page reload, disabled choices, the narrow-screen layout and the
charts' axes. Screenshots go to a temporary folder, or to PLAYGROUND_SCREENSHOT_DIR when set (the
README's images in assets/screenshots/ are made that way). Playwright never downloads a browser here.
This module starts its own app (its model offers example questions) and page, in place of the ones
`conftest.py` gives the tab tests.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from engine import CHOICES, choice_note, list_models, unavailable_reason
from playground.shared.settings import Settings
from tests.playground.browser.actions import (
    BROWSER_MARKS,
    MARK_STATUS,
    assert_axes_readable,
    finished_replies,
    open_page,
    pick,
    send,
    wait_applied,
)
from tests.support.ui_helpers import pick_model, start_app

# The demo model's own suggested questions when it offers some (the README screenshot shows one answered).
EXAMPLES = tuple(getattr(list_models().get("demo"), "examples", ())[:2]) or (
    "What does the json module do?", "How do I read a file line by line?")
pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """This module's app: the picked model, offering EXAMPLES under the chat box (as (context, url))."""
    model = pick_model(tmp_path_factory)
    models = dict(list_models())
    if model in models:  # the loaded model offers example questions under the chat box
        models[model] = dataclasses.replace(models[model], examples=EXAMPLES)
    app, demo, url = start_app(model, Settings(max_new_tokens=256, max_prompt_tokens=400, max_queue=8), models)
    yield app, url
    demo.close()
    app.pool.close()


@pytest.fixture(scope="module")
def page(served, browser):
    """This module's page, on its own app."""
    page = open_page(browser, served[1])
    yield page
    page.close()


# Records every distinct text of the last assistant bubble, to see that the reply streams in.
WATCH_REPLY = """() => {
  window.__replyTexts = [];
  const chat = document.querySelector('#chat');
  new MutationObserver(() => {
    const bots = chat.querySelectorAll('[data-testid="bot"]');
    const last = bots[bots.length - 1];
    if (!last || last.querySelector('.thinking')) return;
    const text = last.innerText.split('engine TTFT')[0].trim();
    const seen = window.__replyTexts;
    if (text && seen[seen.length - 1] !== text) seen.push(text);
  }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


def last_figures(page) -> str:
    return page.locator("#chat .msg-figures:not(.live)").last.inner_text()


def prompt_tokens(figures: str) -> int:
    return int(re.search(r"prompt\s+(\d+) tok", figures).group(1))


def set_number(page, control: str, value: str) -> None:
    box = page.locator(f"{control} input[type=number]")
    box.fill(value)
    box.press("Tab")


def newest_engine(app):
    return app.pool.entries()[-1].engine


# ----- chat --------------------------------------------------------------------------------------


def test_chat_streams_with_both_waits_labelled_and_charts_move(served, page, shots):
    header = page.inner_text("#header")
    assert ("CPU:" in header or "GPU:" in header) and "paged KV/16 + prefix cache" in header
    for chart in ("#chart-throughput", "#chart-kv_blocks", "#chart-batch"):
        assert "all sessions on this engine" in page.inner_text(chart)
    throughput_before = page.locator("#chart-throughput").screenshot()

    page.evaluate(WATCH_REPLY)
    send(page, EXAMPLES[1])  # typed; a question the demo model was trained on, so the screenshot shows its answer
    texts = page.evaluate("window.__replyTexts")
    assert len(texts) >= 2 and len(texts[-1]) > len(texts[0]), f"the reply did not stream: {texts}"
    page.wait_for_function("document.querySelector('#chat .msg-figures:not(.live)').innerText.includes('Enter')",
                           timeout=15_000)
    figures = last_figures(page)
    for label in ("engine TTFT", "Enter → text", "decode", "prompt", "output"):
        assert label in figures
    engine_ms = float(re.search(r"engine TTFT\s+(\d+) ms", figures).group(1))
    waited_ms = float(re.search(r"Enter → text\s+(\d+) ms", figures).group(1))
    assert waited_ms >= engine_ms, "the wait from Enter cannot be shorter than the engine's TTFT"
    title = page.locator("#chat .msg-figures:not(.live) .fig").first.get_attribute("title")
    assert "inside the engine" in title

    page.wait_for_function("document.querySelector('#header').innerText.includes('native backend')",
                           timeout=10_000)  # once loaded, the header says what `auto` resolved to
    assert "attention sdpa" in page.inner_text("#header") or "attention" in page.inner_text("#header")
    row = page.inner_text("#chart-ttft .hrow")
    assert "#1" in row and re.search(r"prompt \d+ tok \(\d+ cached\)", row)
    assert "ms engine" in row and "ms to text" in row
    page.wait_for_timeout(2500)  # a timer refresh of the line charts
    assert page.locator("#chart-throughput").screenshot() != throughput_before, "the throughput chart did not move"

    # The model's example questions sit under the chat box; clicking one sends it.
    assert page.locator("#examples").is_visible()
    before = finished_replies(page)
    page.locator("#examples button", has_text=EXAMPLES[0]).click()
    page.wait_for_function(f"document.querySelectorAll('#chat .msg-figures:not(.live)').length > {before}",
                           timeout=90_000)
    assert EXAMPLES[0] in page.inner_text("#chat")
    assert prompt_tokens(last_figures(page)) > 0
    page.wait_for_function("[...document.querySelectorAll('#chat .msg-figures:not(.live)')].pop()"
                           ".innerText.includes('Enter')", timeout=15_000)  # an example click is timed too
    page.wait_for_function("document.querySelectorAll('#chart-ttft .hrow').length == 2", timeout=10_000)
    page.wait_for_timeout(2500)
    page.set_viewport_size({"width": 1600, "height": 1250})  # tall enough for every chart
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "playground.png"))
    page.set_viewport_size({"width": 1600, "height": 1000})


def test_a_reload_keeps_the_conversation_of_this_browser(page):
    before = page.inner_text("#chat")
    page.reload()
    page.wait_for_selector("#chat", timeout=30_000)
    page.wait_for_function("document.querySelectorAll('#chat .msg-figures').length >= 2", timeout=30_000)
    assert EXAMPLES[0] in page.inner_text("#chat") and "restored 2 turn" in page.inner_text("#chat-notice")
    assert before.split("engine TTFT")[0].strip()[:40] in page.inner_text("#chat")
    assert "spec accept" not in page.inner_text("#chat"), "restored replies gained a chip they never had"
    assert page.locator("#chart-ttft .hrow").count() == 2, page.inner_text("#chart-ttft")


def ttft_rows(page) -> int:
    """Replies the server has finished for this tab (each adds a row to the TTFT chart)."""
    return page.locator("#chart-ttft .hrow").count()


def wait_for_reply_after(page, rows: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('#chart-ttft .hrow').length > {rows} && "
                           "!document.querySelector('#chat .thinking, #chat .msg-figures.live')", timeout=90_000)


def test_retry_undo_edit_and_stop(served, page, monkeypatch):
    bots = page.locator('#chat [data-testid="bot"]')
    count, rows = bots.count(), ttft_rows(page)
    page.locator('#chat button[aria-label="Retry"]').last.click()
    wait_for_reply_after(page, rows)
    assert bots.count() == count, "regenerate must replace the last reply, not add one"

    page.locator('#chat button[aria-label="Undo"]').last.click()
    page.wait_for_function(f"document.querySelectorAll('#chat [data-testid=\"bot\"]').length == {count - 1}",
                           timeout=30_000)
    assert page.input_value("#message textarea") == EXAMPLES[0], "undo puts the question back in the text box"

    rows = ttft_rows(page)
    page.locator('#chat button[aria-label="Edit"]').first.click()
    page.locator("#chat textarea.edit-textarea").fill("Tell me about the os module instead.")
    page.locator('#chat button[aria-label="Submit"]').click()
    wait_for_reply_after(page, rows)
    assert bots.count() == 1 and "os module instead" in page.inner_text("#chat")

    # A reply of the demo model can end within a tenth of a second: its stream is slowed (on the engine's
    # public `stream`) so that Stop reliably arrives while it is still streaming.
    engine = served[0].pool.entries()[-1].engine
    fast_stream = engine.stream

    def slow_stream(*args, **kwargs):
        for delta in fast_stream(*args, **kwargs):
            time.sleep(0.25)
            yield delta

    monkeypatch.setattr(engine, "stream", slow_stream, raising=False)
    page.fill("#message textarea", "Tell me a very long story about every module.")
    page.press("#message textarea", "Enter")
    page.wait_for_selector("#chat .msg-figures.live", timeout=60_000)
    page.click("#stop")
    try:
        page.wait_for_function("document.querySelector('#chat').innerText.includes('stopped')", timeout=30_000)
    except Exception as error:
        raise AssertionError(f"not stopped: {page.inner_text('#chat')[-400:]!r}, notice "
                             f"{page.inner_text('#chat-notice')!r}") from error
    assert engine.stats().num_running == 0


def trash(page) -> None:
    """The chat box's own trash icon; done once the server has emptied the conversation (exports disabled)."""
    page.locator('#chat button[aria-label="Clear"]').first.click()
    page.wait_for_function("document.querySelectorAll('#chat [data-testid=\"bot\"]').length == 0", timeout=30_000)
    page.wait_for_selector("#export-json:disabled", timeout=30_000)


def test_the_chats_trash_icon_clears_what_the_model_sees(page):
    trash(page)
    send(page, "What is a KV block?")
    alone = prompt_tokens(last_figures(page))
    send(page, "And a page?")
    assert prompt_tokens(last_figures(page)) > alone
    trash(page)
    send(page, "What is a KV block?")
    assert prompt_tokens(last_figures(page)) == alone, "the trash icon left old turns in the model's prompt"


def test_exports_download_the_conversation_with_its_figures(page):
    with page.expect_download() as download:
        page.click("#export-json")
    exported = json.loads(Path(download.value.path()).read_text())
    assert [e["user"] for e in exported["exchanges"]] == ["What is a KV block?"]
    assert exported["exchanges"][0]["figures"]["engine_ttft_ms"] > 0
    with page.expect_download() as download:
        page.click("#export-md")
    markdown = Path(download.value.path()).read_text()
    assert "**User:** What is a KV block?" in markdown and "engine TTFT" in markdown


# ----- engine panel --------------------------------------------------------------------------------


def test_presets_are_applied_as_written_and_the_panel_shows_what_loaded(served, page):
    app, _ = served
    pick(page, "#preset", "hf-sequential")
    assert re.match("Loaded|Sharing", wait_applied(page))
    assert page.input_value("#ctl-max_num_seqs input[type=number]") == "1"
    pick(page, "#preset", "static")
    assert re.match("Loaded|Sharing", wait_applied(page))
    assert "preset static" in page.inner_text("#check")
    assert page.input_value("#ctl-max_num_seqs input[type=number]") == "32", "static kept hf-sequential's 1"
    assert page.is_checked('#ctl-batching input[value="static"]')
    assert page.is_checked('#ctl-backend input[value="native"]')
    engine = newest_engine(app)
    assert (engine.config.backend, engine.config.batching, engine.config.max_num_seqs) == ("native", "static", 32)
    pool = page.inner_text("#pool")
    assert "hf backend (transformers)" in pool and "generate static ×1" in pool and "native backend" in pool
    page.wait_for_function("document.querySelector('#check').innerText.includes('active configuration, loaded')",
                           timeout=10_000)
    page.wait_for_function("document.querySelector('#header').innerText.includes('static ×32')", timeout=10_000)


KV_POINTS = "document.querySelector('#chart-kv_blocks polyline').getAttribute('points').split(' ').length"


def test_apply_loads_exactly_the_panels_values_and_shows_its_progress(served, page):
    """Fails if the playground built its usual paged 32-sequence engine whatever the panel said."""
    app, _ = served
    page.evaluate("""() => { window.__sawProgress = false;
      new MutationObserver(() => { if (document.querySelector('#apply-status .load-progress .progress-fill'))
        window.__sawProgress = true; }).observe(document.body, {subtree: true, childList: true}); }""")
    page.locator("#ctl-kv_layout label", has_text="contiguous").click()
    page.locator("#ctl-prefix_caching input").uncheck()
    page.locator("#ctl-batching label", has_text="continuous").click()
    for field, value in (("max_num_seqs", "3"), ("max_model_len", "256"), ("kv_cache_mib", "8"),
                         ("max_num_batched_tokens", "128")):
        set_number(page, f"#ctl-{field}", value)
    page.wait_for_selector("#check .check.ok", timeout=10_000)
    assert "press Apply" in page.inner_text("#check")
    page.wait_for_function(f"{KV_POINTS} >= 4", timeout=20_000)  # the active engine's samples on the KV chart
    page.evaluate(MARK_STATUS)
    page.click("#apply")
    assert "Loaded" in wait_applied(page)
    assert page.evaluate("window.__sawProgress"), "the load showed no progress bar"
    page.wait_for_timeout(2500)  # a timer refresh of the charts: the KV line starts again with the new engine
    drawn = page.evaluate(KV_POINTS)
    assert drawn <= 3, f"the KV chart still draws the previous engine's samples ({drawn} points)"
    for chart in ("#chart-throughput", "#chart-kv_blocks", "#chart-batch"):  # each names the engine it plots now
        assert "contiguous KV" in page.inner_text(f"{chart} .hchart-subtitle"), chart
    engine = newest_engine(app)
    panel = {"kv_layout": "contiguous", "prefix_caching": False, "batching": "continuous", "max_num_seqs": 3,
             "max_model_len": 256, "max_num_batched_tokens": 128}
    assert {k: getattr(engine.config, k) for k in panel} == panel
    assert 4 * 2**20 < engine.stats().kv_cache_bytes <= 8 * 2**20
    assert "active configuration, loaded" in page.inner_text("#check")
    assert "contiguous KV" in page.inner_text("#header") and "×3" in page.inner_text("#header")


def test_what_cannot_run_is_disabled_with_its_reason(page, shots):
    for field in ("device", "attention", "quantization", "backend"):
        for value in CHOICES[field]:
            reason, note = unavailable_reason(field, value), choice_note(field, value)
            choice = page.locator(f'#ctl-{field} input[value="{value}"]')
            assert choice.is_disabled() == bool(reason), f"{field}={value}"
            if reason or note:  # the reason it cannot run, or the engine's note on it, as its tooltip
                assert choice.locator("xpath=..").get_attribute("title") == (reason or note)
            if reason:
                assert value in page.inner_text(f"#ctl-{field}").split("disabled:", 1)[1]
    notes = {v: choice_note("quantization", v) for v in CHOICES["quantization"] if not unavailable_reason(
        "quantization", v) and choice_note("quantization", v)}
    if notes:  # selecting a choice puts its note in the help line
        value = next(iter(notes))
        page.locator(f'#ctl-quantization input[value="{value}"]').click()
        shown = f"document.querySelector('#ctl-quantization').innerText.includes({json.dumps(value + ': ')})"
        page.wait_for_function(shown, timeout=10_000)
        page.locator('#ctl-quantization input[value="none"]').click()
    page.locator("#engine-panel button", has_text="Speculative decoding").click()
    assert page.locator("#ctl-draft_model input").is_disabled()
    assert page.locator("#ctl-num_speculative_tokens input[type=number]").is_disabled()
    if not unavailable_reason("speculative", "draft"):  # they follow speculation as it is switched on and off
        page.locator('#ctl-speculative input[value="draft"]').click()
        page.wait_for_function("!document.querySelector('#ctl-draft_model input').disabled", timeout=10_000)
        assert page.locator("#ctl-num_speculative_tokens input[type=number]").is_enabled()
        page.locator('#ctl-speculative input[value="off"]').click()
        page.wait_for_function("document.querySelector('#ctl-draft_model input').disabled", timeout=10_000)

    page.locator("#ctl-kv_layout label", has_text="contiguous").click()
    page.locator("#ctl-prefix_caching input").check()
    page.wait_for_selector("#check .check.bad", timeout=10_000)
    assert "prefix_caching" in page.inner_text("#check") and page.locator("#apply").is_disabled()
    page.locator("#engine-panel").screenshot(path=str(shots / "engine-panel-refused.png"))
    page.locator("#ctl-kv_layout label", has_text="paged").click()
    page.wait_for_selector("#check .check.ok", timeout=10_000)


def test_clearing_the_preset_field_raises_nothing(page):
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    pick(page, "#preset", "paged-kv")
    wait_applied(page)
    page.fill("#preset input", "")
    page.press("#preset input", "Enter")
    page.locator("#chat").click()
    page.wait_for_timeout(1500)
    assert page.locator(".toast-body.error").count() == 0 and not [e for e in errors if "Error" in e]


def test_hub_models_say_whether_they_need_the_network(page):
    page.click("#ctl-model input")
    options = page.locator("[role=option]").all_inner_texts()
    page.keyboard.press("Escape")
    hub = [o for o in options if "hub," in o]
    assert hub and all("needs download" in o or "cached" in o for o in hub)
    assert any("bundled" in o and "hub" not in o for o in options)


def test_chart_axes_are_readable(page):
    if page.locator("#chart-kv_blocks polyline").count() == 0:  # the line charts draw once an engine is loaded
        send(page, "What is a KV block?")
    for chart in ("#chart-throughput", "#chart-kv_blocks", "#chart-batch"):
        assert_axes_readable(page, chart)
    ticks = page.eval_on_selector_all("#chart-batch svg text.tick", "ticks => ticks.map(t => t.textContent)")
    assert ticks and all(re.fullmatch(r"-?\d+", t) for t in ticks), f"fractional sequences on the axis: {ticks}"


# Whether a text box's placeholder fits on one line of the box (measured in the box's own font).
PLACEHOLDER_FITS = """box => { const t = document.querySelector(box), style = getComputedStyle(t);
    const context = document.createElement('canvas').getContext('2d'); context.font = style.font;
    return context.measureText(t.placeholder).width <= t.clientWidth - parseFloat(style.paddingLeft)
        - parseFloat(style.paddingRight); }"""


def test_a_narrow_screen_puts_the_chat_first_and_collapses_the_panel(served, browser):
    narrow = open_page(browser, served[1], width=400, height=860)
    try:
        narrow.wait_for_timeout(1500)
        chat, panel = narrow.locator("#chat").bounding_box(), narrow.locator("#engine-panel").bounding_box()
        assert chat["y"] < panel["y"] and chat["width"] > 300
        assert not narrow.locator("#ctl-backend").is_visible(), "the engine panel should start collapsed"
        assert narrow.locator("#message textarea").bounding_box()["y"] < 860, "the composer is below the screen"
        assert narrow.evaluate(PLACEHOLDER_FITS, "#message textarea"), "the message box's placeholder is cut"
        narrow.locator("#engine-acc > .label-wrap").click()
        narrow.wait_for_selector("#ctl-backend", state="visible", timeout=5_000)
    finally:
        narrow.close()


def test_measure_repeats_the_prompt_and_a_second_reply_shows_the_spread(page):
    """One reply's figure is noise: Measure ×5 asks the typed message five times and shows the median and range of
    its TTFT and decode speed without adding turns; from a configuration's second reply on, a reply's figures carry
    that configuration's running median and range."""
    before = finished_replies(page)
    page.locator("#message textarea").fill(EXAMPLES[0])
    page.locator("#measure-prompt").click()
    page.wait_for_function("document.querySelector('#chat-notice').innerText.includes('measured 5×')",
                           timeout=120_000)
    notice = page.inner_text("#chat-notice")
    for figure, unit in (("engine TTFT", "ms"), ("decode", "tok/s")):
        median, low, high = (float(x) for x in re.search(
            rf"{figure} median ([\d.]+) {unit}, ([\d.]+)–([\d.]+) {unit}", notice).groups())
        assert low <= median <= high, notice
    assert finished_replies(page) == before  # measured, not added to the conversation
    for question in EXAMPLES[:2]:
        send(page, question)
    page.wait_for_function("/over \\d+ replies/.test([...document.querySelectorAll('#chat .msg-figures:not(.live)')]"
                           ".pop().innerText)", timeout=30_000)
    replies = re.search(r"median [\d.]+ ms, [\d.]+–[\d.]+ ms over (\d+) replies", last_figures(page))
    assert replies and int(replies.group(1)) >= 2, last_figures(page)
    trash(page)  # the module's page is shared: leave the conversation empty
