"""The engine panel's own markup: the Apply status with a load's progress, and the engine pool.

Why apart from the handlers: each is a pure function of what the handlers know (a line of text, a
`LoadJob`'s phase, the pool's entries), so the handlers stay about what Apply does.
"""

from __future__ import annotations

import html
import time

from engine import EngineConfig
from playground.engine_panel.availability import hub_cache_bytes
from playground.figures.configuration import config_summary
from playground.figures.units import format_bytes
from playground.shared.loading import LoadJob, LoadOutcome
from playground.shared.pool import EnginePool


def status_html(kind: str, title: str, detail: str = "", extra: str = "") -> str:
    """The apply status box; `extra` is trusted HTML built by the handlers."""
    return (f'<div class="apply-status {kind}"><div class="apply-title">{html.escape(title)}</div>'
            f'<div class="apply-detail">{html.escape(detail)}</div>{extra}</div>')


def progress_html(job: LoadJob) -> str:
    """The load's phases as steps and one bar: done phases filled, the current one animated."""
    now = time.perf_counter()
    sizing_label = "download from the hub, then size" if job.repo else "size memory"
    steps = [("checked", "check"), ("sizing", sizing_label), ("loading", "load weights + warm up"), ("ready", "ready")]
    current = {"queued": 0, "waiting": 2, "checked": 0, "sizing": 1, "loading": 2, "ready": 3}.get(job.phase, 0)
    items = []
    for index, (_, label) in enumerate(steps):
        state = "done" if index < current else ("now" if index == current else "todo")
        items.append(f'<span class="step {state}">{index + 1}. {html.escape(label)}</span>')
    detail = f"{now - job.phase_started:.1f} s in this phase · {now - job.started:.1f} s in all"
    if job.phase == "waiting":
        detail = "another session is loading the same configuration: waiting for it · " + detail
    if job.phase == "sizing" and job.repo:
        detail += f" · {hub_cache_bytes(job.repo) / 2**20:,.1f} MiB of {job.repo} in the local cache"
    fraction = (current + 0.5) / len(steps)
    return (f'<div class="load-progress"><div class="steps">{"".join(items)}</div>'
            f'<div class="progress-track"><span class="progress-fill" style="width:{fraction * 100:.0f}%"></span>'
            f'</div><div class="progress-detail">{html.escape(detail)}</div></div>')


def loaded_title(outcome: LoadOutcome, shared: bool) -> str:
    """Apply's result line, with the warm-up's share of the load named: the first reply's cost is paid there."""
    warm_up = f"{outcome.info.warmup_seconds:.1f} s of it warming the loaded level's kernels up"
    if shared:
        return f"Sharing the loaded engine (its load took {outcome.load_seconds:.1f} s, {warm_up})"
    return f"Loaded in {outcome.load_seconds:.1f} s ({warm_up})"


def pool_html(pool: EnginePool, mine: EngineConfig) -> str:
    """The pool's engines, newest first, each with its size and users; `mine` (the session's configuration)
    marked as yours."""
    entries = pool.entries()
    budget = pool.memory_budget_bytes
    lines = [f'<div class="pool-head">Engine pool · {len(entries)} of {pool.max_engines} engines · '
             f'{format_bytes(pool.total_bytes())}'
             + (f" of {format_bytes(budget)} budget" if budget else "") + "</div>"]
    for entry in reversed(entries):
        marker = " pool-mine" if entry.key == mine else ""
        users = f"{entry.users} running" if entry.users else f"idle {entry.idle_seconds:.0f} s"
        yours = " · yours" if marker else ""
        summary = html.escape(config_summary(entry.key, entry.engine.info))
        lines.append(f'<div class="pool-entry{marker}"><span>{summary}</span>'
                     f'<span class="pool-size">{format_bytes(entry.size_bytes)} · {users}{yours}</span></div>')
    if not entries:
        lines.append('<div class="pool-entry">no engine loaded yet</div>')
    return "".join(lines)
