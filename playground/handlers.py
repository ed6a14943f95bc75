"""The engine panel's handlers: check, preset, apply (UI and API), page load, charts and the pool list.

Why a class: every handler needs the same few things (the engine pool, the hosting limits, the
curated models), and a session's own state travels in a `Session` held by Gradio per browser tab.
Every handler is reachable over HTTP with any JSON value, so each one parses its input strictly
(`playground.form`) and answers bad input with a message, never an exception. Handlers only use
the engine's public API (`engine/__init__.py`). The chat's handlers are in `playground.chat`.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator

import gradio as gr
import psutil

from engine import EngineConfig, EngineError, EngineInfo, EngineStats, preset_description
from playground import charts
from playground.benchmark import BenchmarkHandlers
from playground.chat import CHART_NAMES, ChatHandlers, ttft_chart
from playground.choices import help_line
from playground.compare import CompareHandlers
from playground.errors import Refused, describe_error
from playground.feature_figures import features_html, unquantized_weights_bytes
from playground.figures import config_summary, format_bytes, header_html
from playground.form import (
    FORM_FIELDS,
    config_to_form,
    enforce_caps,
    extras_of,
    parse_form,
    preset_config,
)
from playground.loading import LoadJob, availability_note, hub_repo, progress_html
from playground.pool import EnginePool
from playground.session import Session, config_key, pack
from playground.settings import Settings

PROGRESS_REFRESH_S = 0.25
APPLY_OUTPUTS = ("header", "status", "apply", "check", "session", "pool", "examples", *FORM_FIELDS)
PAGE_OUTPUTS = ("header", "session", "pool", "check", "examples", "chatbot", "notice", "system_prompt", "stored",
                "export_json", "export_md", "model", *CHART_NAMES, *[f for f in FORM_FIELDS if f != "model"])
REFRESH_OUTPUTS = (*CHART_NAMES, "pool", "header")
PERPLEXITY_PROGRESS = gr.Progress()  # Gradio shows a progress bar for a handler whose default is a gr.Progress
# Fields that only matter while speculative decoding is on.
SPECULATIVE_FIELDS = ("draft_model", "num_speculative_tokens")


def engine_size_bytes(engine) -> int:
    stats = engine.stats()
    return stats.weights_bytes + stats.kv_cache_bytes


def _check_html(kind: str, text: str) -> str:
    mark = {"ok": "✓", "bad": "✕"}.get(kind, "")
    return f'<div class="check {kind}">{mark} {text}</div>'


def _status(kind: str, title: str, detail: str = "", extra: str = "") -> str:
    """The apply status box; `extra` is trusted HTML built here."""
    return (f'<div class="apply-status {kind}"><div class="apply-title">{html.escape(title)}</div>'
            f'<div class="apply-detail">{html.escape(detail)}</div>{extra}</div>')


class Playground:
    """The handlers, bound to one engine pool and one set of hosting limits."""

    def __init__(self, pool: EnginePool, settings: Settings, models: dict, device: str, default_config: dict,
                 presets: list[str], max_kv_cache_bytes: int | None = None):
        self.pool = pool
        self.settings = settings
        self.models = models
        self.curated = list(models)
        self.device = device
        self.default_config = default_config
        self.presets = presets
        self.max_kv_cache_bytes = max_kv_cache_bytes
        self.chat = ChatHandlers(self)
        self.compare = CompareHandlers(self)
        self.benchmark = BenchmarkHandlers(self)

    # ----- configuration -------------------------------------------------------------------

    def new_session(self) -> Session:
        return Session(config=dict(self.default_config))

    def session_of(self, session) -> Session:
        return session if isinstance(session, Session) else self.new_session()

    def validate(self, config: dict) -> dict:
        """A complete, validated config dict within the hosting limits; raises Refused / EngineError.

        Draft mode without a draft model takes the curated draft paired with the model.
        """
        entry = self.models.get(config["model"])
        if config.get("speculative") == "draft" and not config.get("draft_model") and entry is not None:
            config = {**config, "draft_model": entry.draft}
        resolved = EngineConfig.from_dict(config).to_dict()
        for name in (resolved["model"], resolved.get("draft_model")):
            refusal = name and self.settings.model_refusal(name)
            if refusal:
                raise Refused(refusal)
        if self.settings.public:
            enforce_caps(resolved, self.settings, self.max_kv_cache_bytes)
        return resolved

    def _config_from(self, form: tuple | list, extras) -> dict:
        if len(form) != len(FORM_FIELDS):
            raise Refused(f"expected {len(FORM_FIELDS)} panel values, got {len(form)}")
        return self.validate(parse_form(dict(zip(FORM_FIELDS, form, strict=True)),
                                        extras if isinstance(extras, dict) else {}))

    def _error(self, error: BaseException) -> str:
        return describe_error(error, self.settings.public)

    def check(self, *values) -> tuple:
        """Live check of the panel (on every change): why it cannot be applied, or what Apply would do."""
        *form, extras, session = values
        try:
            config = self._config_from(form, extras)
        except (EngineError, Refused) as error:
            return _check_html("bad", html.escape(self._error(error))), gr.Button(interactive=False)
        return self._check_line(config, self.session_of(session)), gr.Button(interactive=True)

    def _check_line(self, config: dict, session: Session) -> str:
        if config == session.config:  # whether it is loaded right now is in the header, which stays current
            return _check_html("ok", "this is the active configuration")
        state = "already loaded, shared" if self.pool.is_loaded(config) else "not loaded yet"
        return _check_html("ok", f"valid · {state} · press Apply")

    @staticmethod
    def _speculative_editable(speculative) -> tuple[bool, bool]:
        """Draft model (draft mode) and speculative tokens (any mode) are editable only while speculation is on."""
        return speculative == "draft", speculative in ("draft", "ngram")

    def dependent_fields(self, speculative) -> tuple:
        return tuple(gr.update(interactive=editable) for editable in self._speculative_editable(speculative))

    def form_updates(self, config: dict) -> dict:
        """The panel showing `config`, with fields that cannot apply to it disabled."""
        form = config_to_form(config, self.curated)
        updates = {name: gr.update(value=form[name]) for name in FORM_FIELDS}
        for name, editable in zip(SPECULATIVE_FIELDS, self._speculative_editable(form["speculative"]), strict=True):
            updates[name] = gr.update(value=form[name], interactive=editable)
        return updates

    def examples_update(self, config: dict):
        entry = self.models.get(config["model"])
        examples = list(getattr(entry, "examples", ()) or ())
        return gr.Dataset(samples=[[question] for question in examples], visible=bool(examples))

    def model_choices(self) -> list[tuple[str, str]]:
        """The curated models, each marked with where it comes from (bundled, hub cached, hub download)."""
        choices = []
        for name, entry in self.models.items():
            label = entry.label or (f"{name} · {entry.params}" if entry.params else name)
            repo = hub_repo(name, self.models)
            if repo is not None:
                label += " · hub, cached" if availability_note(name, self.models).startswith(
                    "hub model, in the local cache") else " · hub, needs download"
            choices.append((label, name))
        return choices

    @staticmethod
    def choice_help(field_name: str):
        """The handler that keeps a choice control's help line on the selected choice's note."""

        def update(value) -> dict:
            return gr.update(info=help_line(field_name, value))

        return update

    def model_info(self, name) -> dict:
        """The model field's help line: memory note and whether loading needs the network."""
        if not isinstance(name, str) or len(name) > 300:
            return gr.update()
        entry = self.models.get(name)
        parts = [entry.memory] if entry is not None and entry.memory else []
        parts.append(availability_note(name, self.models))
        return gr.update(info=" · ".join(parts))

    # ----- presets and apply -----------------------------------------------------------------

    def preset(self, name, session) -> Iterator[tuple]:
        """Apply an optimization preset as written: defaults, the preset's fields, the current model.

        Fills the panel with exactly that configuration, then loads it like Apply. Clearing the
        preset field (None or "") does nothing.
        """
        session = self.session_of(session)
        if name is None or name == "":
            yield pack(APPLY_OUTPUTS, {})
            return
        try:
            config = preset_config(name, session.config["model"], self.presets)
        except (EngineError, Refused) as error:
            yield pack(APPLY_OUTPUTS, {"check": _check_html("bad", html.escape(self._error(error)))})
            return
        note = (f"preset <b>{html.escape(name)}</b>: {html.escape(preset_description(name))} "
                f"(every field it does not name is at its default; model kept: "
                f"{html.escape(session.config['model'])})")
        yield from self._apply(config, extras_of(config), session, note)

    def apply(self, *values) -> Iterator[tuple]:
        """Switch this session to the panel's configuration, loading its engine (or sharing a loaded one).

        A refused or failed configuration leaves the session on its previous engine, and the status
        says why. While an engine loads, the status shows its phases and a progress bar.
        """
        *form, extras, session = values
        session = self.session_of(session)
        try:
            parsed = parse_form(dict(zip(FORM_FIELDS, form, strict=True)) if len(form) == len(FORM_FIELDS) else {},
                                extras if isinstance(extras, dict) else {})
        except Refused as error:
            yield self._refused(error, session)
            return
        yield from self._apply(parsed, extras if isinstance(extras, dict) else {}, session, None)

    def _refused(self, error: BaseException, session: Session) -> tuple:
        still = f"Still serving: {config_summary(session.config)}"
        return pack(APPLY_OUTPUTS, {"status": _status("bad", "Refused", self._error(error), html.escape(still)),
                                    "apply": gr.Button(interactive=False, value="Apply"),
                                    "check": _check_html("bad", html.escape(self._error(error))),
                                    "session": session})

    def _apply(self, requested: dict, extras: dict, session: Session, note: str | None) -> Iterator[tuple]:
        shown = {"check": _check_html("ok", note)} if note else {}
        try:
            config = self.validate(requested)
        except (EngineError, Refused) as error:
            refused = dict(zip(APPLY_OUTPUTS, self._refused(error, session), strict=True))
            if note:  # a preset that cannot run here still shows what it asked for
                refused.update(self.form_updates(requested))
            yield pack(APPLY_OUTPUTS, refused)
            return
        panel = self.form_updates(config)
        shared = self.pool.is_loaded(config)
        job = LoadJob(self.pool, config, None if shared else hub_repo(config["model"], self.models))
        busy = "Sharing the loaded engine…" if shared else f"Loading {config['model']}…"
        while True:  # the phases show at once and then every PROGRESS_REFRESH_S until the load ends
            yield pack(APPLY_OUTPUTS, {**shown, **panel, "status": _status("busy", busy, "", progress_html(job)),
                                       "apply": gr.Button(interactive=False, value="Loading…")})
            if job.wait(PROGRESS_REFRESH_S):
                break
        if job.error is not None:
            still = f"Still serving: {config_summary(session.config)}"
            yield pack(APPLY_OUTPUTS, {**panel, "status": _status("bad", "Load failed", self._error(job.error),
                                                                   html.escape(still)),
                                       "apply": gr.Button(interactive=True, value="Apply"),
                                       "check": _check_html("bad", "this configuration failed to load (see below)"),
                                       "session": session, "pool": self.pool_summary(session)})
            return
        outcome = job.outcome
        session.config, session.extras = config, dict(extras)
        detail = (f"weights {format_bytes(outcome.stats.weights_bytes)} · "
                  f"KV cache {format_bytes(outcome.stats.kv_cache_bytes)} · "
                  f"context {outcome.info.max_model_len} tokens")
        title = (f"Sharing the loaded engine (its load took {outcome.load_seconds:.1f} s)" if shared
                 else f"Loaded in {outcome.load_seconds:.1f} s")
        notices = "".join(f"<li>{html.escape(n)}</li>" for n in outcome.info.notices)
        yield pack(APPLY_OUTPUTS, {
            **panel,
            "header": header_html(self.device, config, outcome.info, outcome.load_seconds),
            "status": _status("ok", title, detail, f"<ul>{notices}</ul>" if notices else ""),
            "apply": gr.Button(interactive=True, value="Apply"),
            "check": _check_html("ok", (note + " · " if note else "") + "this is the active configuration, loaded"),
            "session": session, "pool": self.pool_summary(session), "examples": self.examples_update(config),
        })

    def load(self, config: dict) -> tuple[dict, EngineInfo]:
        """Load (or share) `config` and wait: (the engine's resolved config, its info). Raises what the load raised."""
        job = LoadJob(self.pool, config, hub_repo(config["model"], self.models))
        job.wait(None)
        if job.error is not None:
            raise job.error
        return job.outcome.config, job.outcome.info

    def api_apply(self, *values) -> tuple[str, dict, dict]:
        """`/apply` for API clients: (status line, the loaded engine's resolved config, engine info).

        The parameters default to the panel's defaults; a refused or failed configuration raises a
        gr.Error with the reason (the session keeps its previous configuration).
        """
        *form, extras, session = values
        session = self.session_of(session)
        try:
            config = self._config_from(form, extras)
            resolved, info = self.load(config)
        except Exception as error:  # every failure becomes one readable API error
            raise gr.Error(self._error(error), print_exception=False) from None
        session.config, session.extras = config, extras_of(config)
        public_info = {key: getattr(info, key) for key in ("model", "backend", "attention", "dtype", "device",
                                                           "num_params", "vocab_size", "max_model_len")}
        public_info["notices"] = list(info.notices)
        return f"loaded: {config_summary(config, info)}", resolved, public_info

    def api_apply_preset(self, name, session) -> tuple[str, dict, dict]:
        """`/apply_preset`: a preset as written (defaults + its fields, the session's model), loaded."""
        session = self.session_of(session)
        try:
            config = self.validate(preset_config(name, session.config["model"], self.presets))
        except (EngineError, Refused) as error:
            raise gr.Error(self._error(error), print_exception=False) from None
        form = config_to_form(config, self.curated)
        return self.api_apply(*[form[f] for f in FORM_FIELDS], extras_of(config), session)

    # ----- page -----------------------------------------------------------------------------

    def page_load(self, session, stored) -> tuple:
        """A new tab: header, panel, pool, the conversation kept in this browser (if any), charts."""
        session = self.session_of(session)
        restored = self.chat.restore(session, stored)
        form = self.form_updates(session.config)
        form.pop("model")
        return pack(PAGE_OUTPUTS, {
            **form, **restored, **dict(zip(CHART_NAMES, self.chart_outputs(session), strict=True)),
            "header": self.header(session), "session": session, "pool": self.pool_summary(session),
            "check": self._check_line(session.config, session), "examples": self.examples_update(session.config),
            "model": gr.update(choices=self.model_choices(),
                               value=config_to_form(session.config, self.curated)["model"]),
        })

    def header(self, session: Session) -> str:
        """The header for this session's configuration, with what `auto` resolved to once loaded."""
        with self.pool.lease_if_loaded(session.config) as entry:
            info = entry.engine.info if entry else None
            load_seconds = entry.load_seconds if entry else None
        return header_html(self.device, session.config, info, load_seconds)

    def refresh(self, session) -> tuple:
        """Timer tick: the charts, the pool list and the header."""
        session = self.session_of(session)
        return pack(REFRESH_OUTPUTS, {**dict(zip(CHART_NAMES, self.chart_outputs(session), strict=True)),
                                      "pool": self.pool_summary(session), "header": self.header(session)})

    # ----- charts and pool -----------------------------------------------------------------

    def chart_outputs(self, session: Session, engine=None) -> tuple:
        """The five charts, from the engine serving this session (if it is loaded) and the session itself."""
        if engine is None:
            with self.pool.lease_if_loaded(session.config) as entry:
                return self._charts(session, entry.engine if entry else None)
        return self._charts(session, engine)

    def _charts(self, session: Session, engine) -> tuple:
        now = time.perf_counter()
        steps, stats, info = [], None, None
        if engine is not None:
            steps = engine.step_history(since=now - charts.WINDOW_S)
            stats, info = engine.stats(), engine.info
            session.kv_samples = charts.trim_samples(session.kv_samples, now) + [charts.kv_sample(stats, now)]
        session.activity.trim(now)
        frames = {
            charts.THROUGHPUT.name: charts.throughput_frame(steps, session.activity, now),
            charts.KV_BLOCKS.name: charts.kv_blocks_frame(session.kv_samples, now),
            charts.BATCH.name: charts.batch_frame(steps, session.activity, now),
            charts.SPECULATIVE.name: charts.speculative_frame(steps, now),
        }
        labels = {charts.KV_BLOCKS.name: charts.kv_blocks_label(session.kv_samples),
                  charts.SPECULATIVE.name: charts.speculative_label(steps)}
        plots = {}
        for spec in charts.LINE_CHARTS:
            frame = frames[spec.name]
            if frame.empty:  # gradio's plots do not recover from a first render without data
                plots[spec.name] = gr.skip()
            else:
                plots[spec.name] = gr.LinePlot(value=frame, label=labels.get(spec.name, spec.title),
                                               y_lim=[0, charts.axis_top(frame[spec.y], spec.integer_y)],
                                               visible=True)
        speculating = session.config.get("speculative", "off") != "off"
        if not speculating:  # the acceptance chart shows only while this configuration speculates
            plots[charts.SPECULATIVE.name] = gr.LinePlot(visible=False)
        rss = psutil.Process().memory_info().rss
        return (ttft_chart(session), plots[charts.THROUGHPUT.name],
                charts.memory_html(stats, rss, config_summary(session.config, info)),
                plots[charts.KV_BLOCKS.name], plots[charts.BATCH.name], plots[charts.SPECULATIVE.name],
                self._features(session, engine, stats, info))

    def _features(self, session: Session, engine, stats: EngineStats | None, info: EngineInfo | None,
                  status: str | None = None) -> str:
        """The quality-and-optimizations panel of the engine serving this session (None: not loaded)."""
        perplexity = engine.held_out_perplexity if engine is not None else None
        if perplexity is None and status is None and engine is not None and engine.tokenizer is None:
            status = "n/a: this model has no tokenizer, and perplexity is measured on text"
        unquantized = (unquantized_weights_bytes(session.config)
                       if session.config.get("quantization", "none") != "none" else None)
        return features_html(session.config, stats, info, perplexity, unquantized, status)

    def measure_perplexity(self, session, progress=PERPLEXITY_PROGRESS) -> str:
        """Measure the held-out perplexity of the engine serving this session (once per engine; cached), with
        a progress bar; requests keep being served meanwhile."""
        session = self.session_of(session)
        with self.pool.lease_if_loaded(session.config) as entry:
            if entry is None:
                return features_html(None, None, None, None, None)
            engine = entry.engine
            status = None
            try:
                engine.perplexity(progress=lambda done, total: progress(done / total, desc="scoring held-out text"))
            except EngineError as error:
                status = f"could not be measured: {describe_error(error, self.settings.public)}"
            return self._features(session, engine, engine.stats(), engine.info, status)

    def pool_summary(self, session: Session | None) -> str:
        entries = self.pool.entries()
        budget = self.pool.memory_budget_bytes
        mine = config_key(session.config) if session else None
        lines = [f'<div class="pool-head">Engine pool · {len(entries)} of {self.pool.max_engines} engines · '
                 f'{format_bytes(self.pool.total_bytes())}'
                 + (f" of {format_bytes(budget)} budget" if budget else "") + "</div>"]
        for entry in reversed(entries):
            config = json.loads(entry.key)
            marker = " pool-mine" if entry.key == mine else ""
            users = f"{entry.users} running" if entry.users else f"idle {entry.idle_seconds:.0f} s"
            yours = " · yours" if marker else ""
            summary = html.escape(config_summary(config, entry.engine.info))
            lines.append(f'<div class="pool-entry{marker}"><span>{summary}</span>'
                         f'<span class="pool-size">{format_bytes(entry.size_bytes)} · {users}{yours}</span></div>')
        if not entries:
            lines.append('<div class="pool-entry">no engine loaded yet</div>')
        return "".join(lines)
