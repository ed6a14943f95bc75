"""The engine panel's handlers: the live check, presets, Apply (UI and `/apply`, `/apply_preset`), and what the
panel shows of the active configuration (the header, the engine pool, the model's example questions).

Why a class: every handler needs the context (the engine pool, the hosting limits, the curated models),
and a session's own state travels in a `Session` held by Gradio per browser tab. Every handler is
reachable over HTTP with any JSON value, so each one parses its input strictly (`engine_panel/form.py`)
and answers bad input with a message, never an exception.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

import gradio as gr

from engine import EngineConfig, EngineError, EngineInfo, hub_repo, preset_description
from playground.engine_panel.availability import availability_note, needs_download
from playground.engine_panel.choices import help_line
from playground.engine_panel.form import FORM_FIELDS, config_to_form, extras_of, read_form
from playground.engine_panel.plan_preview import apply_preview
from playground.engine_panel.views import loaded_title, pool_html, progress_html, status_html
from playground.figures.configuration import check_html, config_summary, header_html
from playground.figures.export_view import export_html
from playground.figures.units import format_bytes
from playground.shared.configs import preset_config
from playground.shared.context import PlaygroundContext
from playground.shared.errors import Refused
from playground.shared.loading import LoadJob
from playground.shared.session import Session, pack

PROGRESS_REFRESH_S = 0.25
APPLY_OUTPUTS = ("header", "status", "apply", "check", "session", "pool", "examples", *FORM_FIELDS)
# Fields that only matter while speculative decoding is on.
SPECULATIVE_FIELDS = ("draft_model", "num_speculative_tokens")
PUBLIC_INFO = ("model", "backend", "attention", "dtype", "kv_cache_dtype", "device", "num_params", "vocab_size",
               "max_model_len")


class PanelHandlers:
    """The engine panel's handlers, over the context's pool and limits."""

    def __init__(self, context: PlaygroundContext):
        self.context = context

    # ----- the live check and the controls -------------------------------------------------

    def check(self, *values) -> tuple:
        """Live check of the panel (on every change): why it cannot be applied, or what Apply would load."""
        *form, extras, session = values
        try:
            config = self.context.validate(read_form(form, extras))
        except (EngineError, Refused) as error:
            return check_html("bad", html.escape(self.context.describe(error))), gr.Button(interactive=False)
        line, applicable = self.check_line(config, self.context.session_of(session))
        return line, gr.Button(interactive=applicable)

    def check_line(self, config: EngineConfig, session: Session) -> tuple[str, bool]:
        """The line of a valid configuration: active, loaded or not, and its plan (what Apply would load); and
        whether Apply can load it (its plan may refuse it: the checkpoint's context, heads, or a missing file)."""
        try:
            plan = apply_preview(config)
        except Exception as error:  # the plan's refusal: Apply would fail with the same message
            return check_html("bad", html.escape(self.context.describe(error))), False
        if config == session.config:  # whether it is loaded right now is in the header, which stays current
            return check_html("ok", "this is the active configuration", plan), True
        state = "already loaded, shared" if self.context.pool.is_loaded(config) else "not loaded yet"
        return check_html("ok", f"valid · {state} · press Apply", plan), True

    @staticmethod
    def _speculative_editable(speculative) -> tuple[bool, bool]:
        """Draft model (draft mode) and speculative tokens (any mode) are editable only while speculation is on."""
        return speculative == "draft", speculative in ("draft", "ngram")

    def dependent_fields(self, speculative) -> tuple:
        return tuple(gr.update(interactive=editable) for editable in self._speculative_editable(speculative))

    def form_updates(self, fields: dict) -> dict:
        """The panel showing a configuration's fields, with fields that cannot apply to it disabled."""
        form = config_to_form(fields, self.context.curated)
        updates = {name: gr.update(value=form[name]) for name in FORM_FIELDS}
        for name, editable in zip(SPECULATIVE_FIELDS, self._speculative_editable(form["speculative"]), strict=True):
            updates[name] = gr.update(value=form[name], interactive=editable)
        return updates

    def examples_update(self, config: EngineConfig):
        """The example questions under the chat box: the model's own, hidden when it has none."""
        entry = self.context.models.get(config.model)
        examples = entry.examples if entry is not None else ()
        return gr.Dataset(samples=[[question] for question in examples], visible=bool(examples))

    def model_choices(self) -> list[tuple[str, str]]:
        """The curated models, each marked with where it comes from (bundled, hub cached, hub download)."""
        choices = []
        for name, entry in self.context.models.items():
            label = entry.label or (f"{name} · {entry.params}" if entry.params else name)
            if hub_repo(name) is not None:
                label += " · hub, needs download" if needs_download(name) else " · hub, cached"
            choices.append((label, name))
        return choices

    def choice_help(self, field_name: str):
        """The handler that keeps a choice control's help line on the selected choice's note."""
        zero_gpu = self.context.settings.zero_gpu

        def update(value) -> dict:
            return gr.update(info=help_line(field_name, value, zero_gpu))

        return update

    def model_info(self, name) -> dict:
        """The model field's help line: memory note and whether loading needs the network."""
        if not isinstance(name, str) or len(name) > 300:
            return gr.update()
        entry = self.context.models.get(name)
        parts = [entry.memory] if entry is not None and entry.memory else []
        parts.append(availability_note(name))
        return gr.update(info=" · ".join(parts))

    # ----- presets and apply -----------------------------------------------------------------

    def preset(self, name, session) -> Iterator[tuple]:
        """Apply an optimization preset as written: defaults, the preset's fields, the current model.

        Fills the panel with exactly that configuration, then loads it like Apply. Clearing the
        preset field (None or "") does nothing.
        """
        session = self.context.session_of(session)
        if name is None or name == "":
            yield pack(APPLY_OUTPUTS, {})
            return
        model = session.config.model
        try:
            fields = preset_config(name, model, self.context.presets)
        except (EngineError, Refused) as error:
            yield pack(APPLY_OUTPUTS, {"check": check_html("bad", html.escape(self.context.describe(error)))})
            return
        note = (f"preset <b>{html.escape(name)}</b>: {html.escape(preset_description(name))} "
                f"(every field it does not name is at its default; model kept: {html.escape(model)})")
        yield from self._apply(fields, session, note)

    def apply(self, *values) -> Iterator[tuple]:
        """Switch this session to the panel's configuration, loading its engine (or sharing a loaded one).

        A refused or failed configuration leaves the session on its previous engine, and the status
        says why. While an engine loads, the status shows its phases and a progress bar.
        """
        *form, extras, session = values
        session = self.context.session_of(session)
        try:
            fields = read_form(form, extras)
        except Refused as error:
            yield self._refused(error, session)
            return
        yield from self._apply(fields, session, None)

    def _refused(self, error: BaseException, session: Session) -> tuple:
        still = f"Still serving: {config_summary(session.config)}"
        reason = self.context.describe(error)
        return pack(APPLY_OUTPUTS, {"status": status_html("bad", "Refused", reason, html.escape(still)),
                                    "apply": gr.Button(interactive=False, value="Apply"),
                                    "check": check_html("bad", html.escape(reason)), "session": session})

    def _apply(self, requested: dict, session: Session, note: str | None) -> Iterator[tuple]:
        shown = {"check": check_html("ok", note)} if note else {}
        try:
            config = self.context.validate(requested)
        except (EngineError, Refused) as error:
            refused = dict(zip(APPLY_OUTPUTS, self._refused(error, session), strict=True))
            if note:  # a preset that cannot run here still shows what it asked for
                refused.update(self.form_updates(requested))
            yield pack(APPLY_OUTPUTS, refused)
            return
        panel = self.form_updates(config.to_dict())
        pool = self.context.pool
        shared = pool.is_loaded(config)
        job = LoadJob(pool, config, None if shared else hub_repo(config.model))
        busy = "Sharing the loaded engine…" if shared else f"Loading {config.model}…"
        while True:  # the phases show at once and then every PROGRESS_REFRESH_S until the load ends
            yield pack(APPLY_OUTPUTS, {**shown, **panel, "status": status_html("busy", busy, "", progress_html(job)),
                                       "apply": gr.Button(interactive=False, value="Loading…")})
            if job.wait(PROGRESS_REFRESH_S):
                break
        if job.error is not None:
            still = f"Still serving: {config_summary(session.config)}"
            yield pack(APPLY_OUTPUTS, {**panel, "status": status_html("bad", "Load failed",
                                                                      self.context.describe(job.error),
                                                                      html.escape(still)),
                                       "apply": gr.Button(interactive=True, value="Apply"),
                                       "check": check_html("bad", "this configuration failed to load (see below)"),
                                       "session": session, "pool": self.pool_summary(session)})
            return
        outcome = job.outcome
        session.config = config
        detail = (f"weights {format_bytes(outcome.stats.weights_bytes)} · "
                  f"KV cache {format_bytes(outcome.stats.kv_cache_bytes)} · "
                  f"context {outcome.info.max_model_len} tokens")
        notices = "".join(f"<li>{html.escape(n)}</li>" for n in outcome.info.notices)
        yield pack(APPLY_OUTPUTS, {
            **panel,
            "header": header_html(self.context.device, config, outcome.info, outcome.load_seconds),
            "status": status_html("ok", loaded_title(outcome, shared), detail,
                                  f"<ul>{notices}</ul>" if notices else ""),
            "apply": gr.Button(interactive=True, value="Apply"),
            "check": check_html("ok", (note + " · " if note else "") + "this is the active configuration, loaded"),
            "session": session, "pool": self.pool_summary(session), "examples": self.examples_update(config),
        })

    def load(self, config: EngineConfig) -> tuple[EngineConfig, EngineInfo]:
        """Load (or share) `config` and wait: (the engine's resolved configuration, its info). Raises what the
        load raised."""
        job = LoadJob(self.context.pool, config, hub_repo(config.model))
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
        session = self.context.session_of(session)
        try:
            config = self.context.validate(read_form(form, extras))
            resolved, info = self.load(config)
        except Exception as error:  # every failure becomes one readable API error
            raise gr.Error(self.context.describe(error), print_exception=False) from None
        session.config = config
        public_info = {key: getattr(info, key) for key in PUBLIC_INFO}
        public_info["notices"] = list(info.notices)
        return f"loaded: {config_summary(config, info)}", resolved.to_dict(), public_info

    def api_apply_preset(self, name, session) -> tuple[str, dict, dict]:
        """`/apply_preset`: a preset as written (defaults + its fields, the session's model), loaded."""
        session = self.context.session_of(session)
        try:
            config = self.context.validate(preset_config(name, session.config.model, self.context.presets))
        except (EngineError, Refused) as error:
            raise gr.Error(self.context.describe(error), print_exception=False) from None
        fields = config.to_dict()
        form = config_to_form(fields, self.context.curated)
        return self.api_apply(*[form[f] for f in FORM_FIELDS], extras_of(fields), session)

    # ----- what the page shows of the active configuration -------------------------------------

    def header(self, session: Session) -> str:
        """The header for this session's configuration, with what `auto` resolved to once loaded."""
        with self.context.pool.lease_if_loaded(session.config) as entry:
            info = entry.engine.info if entry else None
            load_seconds = entry.load_seconds if entry else None
        return header_html(self.context.device, session.config, info, load_seconds, self.context.startup.line)

    def pool_summary(self, session: Session) -> str:
        """The engine pool, then how to run this session's configuration on vLLM / SGLang (closed until opened)."""
        return pool_html(self.context.pool, session.config) + export_html(session.config)
