() => {
  // The playground's page script (run once on load; filled in by page_js in playground/app.py).
  // 1. Radio choices that cannot run on this host are disabled, with the reason as their tooltip; the
  //    others carry the engine's note on them (what they do, whether they are slow here) as theirs.
  // 2. On a narrow screen the engine panel and the sampling controls start collapsed (CSS puts the chat first).
  // 3. Every control named in the glossary gets its plain-words entry as a tooltip (playground/glossary/terms.py).
  // 4. The wait a person sees: from Enter (or Send, or an example) to the first text of the new reply
  //    on screen, sent to the server to sit beside the engine's own TTFT. It is sent once the reply's
  //    figures are final, and again while they do not show it: the reply's last update, computed before
  //    the report reached the server, can arrive after the server's answer to it and overwrite it.
  const CHOICES = __CHOICES__;
  const TOOLTIPS = __TOOLTIPS__;

  const addTooltips = () => {
    for (const [id, text] of Object.entries(TOOLTIPS)) {
      const element = document.getElementById(id);
      if (element && !element.title) element.title = text;
    }
  };

  const markChoices = () => {
    for (const [field, { unavailable, notes }] of Object.entries(CHOICES)) {
      const root = document.getElementById(`ctl-${field}`);
      if (!root) continue;
      for (const input of root.querySelectorAll('input[type="radio"]')) {
        const label = input.closest("label");
        const reason = unavailable[input.value];
        if (reason && !input.disabled) {
          input.disabled = true;
          label.title = reason;
        } else if (!reason && notes[input.value] && !label.title) {
          label.title = notes[input.value];
        }
      }
    }
  };

  const collapseOnNarrowScreens = (triesLeft) => {
    if (!window.matchMedia("(max-width: 900px)").matches) return;
    const toggles = ["#engine-acc", "#sampling-acc"].map((id) => document.querySelector(`${id} > .label-wrap`));
    if (toggles.some((toggle) => !toggle)) {
      if (triesLeft > 0) setTimeout(() => collapseOnNarrowScreens(triesLeft - 1), 200);
      return;
    }
    toggles.filter((toggle) => toggle.classList.contains("open")).forEach((toggle) => toggle.click());
  };

  const botMessages = () => document.querySelectorAll('#chat .message.bot, #chat [data-testid="bot"]');
  let armedAt = null;
  let botsWhenArmed = 0;
  let waitedMs = null;
  const arm = () => {
    armedAt = performance.now();
    botsWhenArmed = botMessages().length;
    waitedMs = null;
  };
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && event.target.closest && event.target.closest("#message")) arm();
  }, true);
  document.addEventListener("click", (event) => {
    if (event.target.closest && event.target.closest("#send, #examples button")) arm();
  }, true);

  const visibleText = (bubble) => {
    const copy = bubble.cloneNode(true);
    copy.querySelectorAll(".msg-figures, .thinking, button, svg").forEach((node) => node.remove());
    return (copy.innerText || copy.textContent || "").trim();
  };
  const report = (milliseconds) => {
    const box = document.querySelector("#visible-latency textarea, #visible-latency input");
    const send = document.querySelector("#visible-latency-send");
    if (!box || !send) return;
    box.value = milliseconds.toFixed(1);
    box.dispatchEvent(new Event("input", { bubbles: true }));
    send.click();
  };

  const newestFigures = () => {
    const bots = botMessages();
    const newest = bots[bots.length - 1];
    return newest ? newest.querySelector(".msg-figures:not(.live)") : null;
  };
  // The measured wait of reply number `reply`, kept until that reply's final figures show it: any later
  // update that lacks it (whenever it arrives) sends it again, at most once per REPORT_GAP_MS and TRIES times.
  const REPORT_GAP_MS = 700;
  const TRIES = 6;
  let unshown = null;
  const showMeasuredWait = () => {
    if (unshown === null) return;
    const figures = newestFigures();
    if (armedAt !== null || botMessages().length !== unshown.reply || unshown.triesLeft <= 0) {
      unshown = null;
      return;
    }
    if (!figures || figures.innerText.includes("Enter")) return;
    const now = performance.now();
    if (now - unshown.reportedAt < REPORT_GAP_MS) return;
    unshown.reportedAt = now;
    unshown.triesLeft -= 1;
    report(unshown.milliseconds);
    setTimeout(showMeasuredWait, REPORT_GAP_MS + 50);  // checked again even if nothing changes on the page
  };

  new MutationObserver(() => {
    markChoices();
    addTooltips();
    const bots = botMessages();
    const newest = bots[bots.length - 1];
    if (armedAt !== null && bots.length > botsWhenArmed && visibleText(newest)) {
      waitedMs = performance.now() - armedAt;
      armedAt = null;
    }
    if (waitedMs !== null && newestFigures()) {
      unshown = { milliseconds: waitedMs, reply: bots.length, triesLeft: TRIES, reportedAt: -Infinity };
      waitedMs = null;
    }
    showMeasuredWait();
  }).observe(document.body, { subtree: true, childList: true, characterData: true });

  markChoices();
  addTooltips();
  collapseOnNarrowScreens(25);
}
