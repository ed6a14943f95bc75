"""The event functions behind the playground's controls.

Why a class: every handler needs the same few things (the engine pool, the hosting limits, the
curated models), and a session's own state (its active configuration, its chat, its turns)
travels in a `Session` object held by Gradio per browser tab. Handlers only use the engine's
public API: `Engine`, `EngineConfig`, `SamplingParams`, `stream`, `stats`, `step_history`.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import gradio as gr

from engine import EngineConfig, EngineError, SamplingParams, load_preset, preset_description, unavailable_reason
from playground import charts
from playground.conversation import PromptTooLong, as_prompt, count_prompt_tokens, fit_history
from playground.figures import figures_html, format_bytes, header_html, model_label, reply_figures
from playground.pool import EnginePool
from playground.settings import Settings

# The engine panel's controls, in the order the UI passes them to `apply` and `check`.
FORM_FIELDS = (
    "model", "custom_model", "backend", "dtype", "quantization", "attention", "kv_layout", "block_size",
    "prefix_caching", "kv_cache_mib", "batching", "max_num_seqs", "speculative", "draft_model",
    "num_speculative_tokens", "gqa", "tensor_parallel_size",
)
CHART_REFRESH_S = 0.5
TEXT_REFRESH_S = 0.05
MIB = 1024 * 1024


@dataclass
class Session:
    """One browser tab: its active configuration and its conversation."""

    config: dict
    extras: dict = field(default_factory=dict)  # preset fields that have no control (e.g. max_model_len)
    history: list[dict] = field(default_factory=list)  # what the model sees
    display: list[dict] = field(default_factory=list)  # what the chat shows (with each reply's figures)
    turns: list[dict] = field(default_factory=list)
    kv_samples: list[dict] = field(default_factory=list)
    last_figures: dict | None = None
    streaming: bool = False


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def engine_size_bytes(engine) -> int:
    stats = engine.stats()
    return int(stats.get("weights_bytes", 0)) + int(stats.get("kv_cache_bytes", 0))


def choice_label(field_name: str, value) -> tuple[str, object]:
    """A choice as (label, value); an unusable choice says so in its label."""
    return (f"{value} (unavailable)" if unavailable_reason(field_name, value) else str(value)), value


def availability_note(field_name: str, values) -> str | None:
    """One line naming the unusable choices of a control and why, or None if all are usable."""
    reasons: dict[str, list[str]] = {}
    for value in values:
        reason = unavailable_reason(field_name, value)
        if reason:
            generic = " ".join(reason.replace(repr(value), "").replace(f"({value})", "").split())
            reasons.setdefault(generic, []).append(str(value))
    if not reasons:
        return None
    return "; ".join(f"{', '.join(vals)}: {reason}" for reason, vals in reasons.items())


def form_to_config(values: dict, extras: dict) -> dict:
    """Turn the panel's values into EngineConfig fields (not yet validated)."""
    model = (values.get("custom_model") or "").strip() or values["model"]
    gqa = values["gqa"]
    if isinstance(gqa, str) and gqa.isdigit():
        gqa = int(gqa)
    kv_mib = values.get("kv_cache_mib") or 0
    config = {
        **extras,
        "model": model,
        "backend": values["backend"],
        "dtype": values["dtype"],
        "quantization": values["quantization"],
        "attention": values["attention"],
        "kv_layout": values["kv_layout"],
        "block_size": int(values["block_size"]),
        "prefix_caching": bool(values["prefix_caching"]),
        "kv_cache_bytes": int(float(kv_mib) * MIB) if float(kv_mib) > 0 else None,
        "batching": values["batching"],
        "max_num_seqs": int(values["max_num_seqs"]),
        "speculative": values["speculative"],
        "draft_model": (values.get("draft_model") or None) if values["speculative"] == "draft" else None,
        "num_speculative_tokens": int(values["num_speculative_tokens"]),
        "gqa": gqa,
        "tensor_parallel_size": int(values["tensor_parallel_size"]),
    }
    return config


def config_to_form(config: dict, curated: list[str]) -> dict:
    """The panel's values for a configuration (the inverse of `form_to_config`)."""
    kv_bytes = config.get("kv_cache_bytes")
    return {
        "model": config["model"] if config["model"] in curated else (curated[0] if curated else config["model"]),
        "custom_model": "" if config["model"] in curated else config["model"],
        "backend": config["backend"], "dtype": config["dtype"], "quantization": config["quantization"],
        "attention": config["attention"], "kv_layout": config["kv_layout"], "block_size": config["block_size"],
        "prefix_caching": config["prefix_caching"], "kv_cache_mib": round(kv_bytes / MIB) if kv_bytes else 0,
        "batching": config["batching"], "max_num_seqs": config["max_num_seqs"],
        "speculative": config["speculative"], "draft_model": config.get("draft_model") or "",
        "num_speculative_tokens": config["num_speculative_tokens"], "gqa": str(config["gqa"]),
        "tensor_parallel_size": config["tensor_parallel_size"],
    }


class Playground:
    """The handlers, bound to one engine pool and one set of hosting limits."""

    def __init__(self, pool: EnginePool, settings: Settings, models: dict, device: str, default_config: dict):
        self.pool = pool
        self.settings = settings
        self.models = models
        self.curated = list(models)
        self.device = device
        self.default_config = default_config

    # ----- configuration -------------------------------------------------------------------

    def new_session(self) -> Session:
        return Session(config=dict(self.default_config))

    def validate(self, config: dict) -> dict:
        """A complete, validated config dict; raises ConfigError / ValueError with the reason.

        Draft mode without a draft model takes the curated draft paired with the model.
        """
        entry = self.models.get(config["model"])
        if config.get("speculative") == "draft" and not config.get("draft_model") and entry is not None:
            config = {**config, "draft_model": entry.draft}
        resolved = EngineConfig.from_dict(config).to_dict()
        for name in (resolved["model"], resolved.get("draft_model")):
            refusal = name and self.settings.model_refusal(name)
            if refusal:
                raise EngineError(refusal)
        return resolved

    def check(self, *values) -> tuple:
        """Live check of the panel (on every change): the reason it cannot be applied, if any."""
        *form, extras, session = values
        try:
            config = self.validate(form_to_config(dict(zip(FORM_FIELDS, form, strict=True)), extras))
        except (EngineError, ValueError) as error:
            return f'<div class="check bad">✕ {_escape(str(error))}</div>', gr.Button(interactive=False)
        if session is not None and config == session.config:
            return '<div class="check ok">✓ this is the active configuration</div>', gr.Button(interactive=True)
        state = "already loaded, shared" if self.pool.is_loaded(config) else "not loaded yet"
        return (f'<div class="check ok">✓ valid · {state} · press Apply</div>', gr.Button(interactive=True))

    def apply(self, model, custom_model, backend, dtype, quantization, attention, kv_layout, block_size,
              prefix_caching, kv_cache_mib, batching, max_num_seqs, speculative, draft_model,
              num_speculative_tokens, gqa, tensor_parallel_size, extras, session: Session) -> Iterator[tuple]:
        """Switch this session to a new configuration, loading its engine (or sharing a loaded one).

        Yields (header, status, apply button, session, pool summary). A refused or failed
        configuration leaves the session on its previous engine, and the status says why.
        """
        values = dict(model=model, custom_model=custom_model, backend=backend, dtype=dtype,
                      quantization=quantization, attention=attention, kv_layout=kv_layout, block_size=block_size,
                      prefix_caching=prefix_caching, kv_cache_mib=kv_cache_mib, batching=batching,
                      max_num_seqs=max_num_seqs, speculative=speculative, draft_model=draft_model,
                      num_speculative_tokens=num_speculative_tokens, gqa=gqa,
                      tensor_parallel_size=tensor_parallel_size)
        session = session or self.new_session()
        try:
            config = self.validate(form_to_config(values, extras or {}))
        except (EngineError, ValueError) as error:
            yield (gr.skip(), self._status("bad", "Refused", str(error), self._still_serving(session)),
                   gr.Button(interactive=True, value="Apply"), session, self.pool_summary(session))
            return
        shared = self.pool.is_loaded(config)
        busy = "Sharing the loaded engine…" if shared else f"Loading {config['model']}…"
        yield (gr.skip(), self._status("busy", busy, "", ""),
               gr.Button(interactive=False, value="Loading…"), session, gr.skip())
        try:
            with self.pool.lease(config) as entry:
                info, load_seconds = dict(entry.engine.info), entry.load_seconds
                stats = entry.engine.stats()
        except Exception as error:  # a failed load of any kind leaves the previous engine serving
            reason = str(error) if isinstance(error, EngineError) else f"{type(error).__name__}: {error}"
            yield (gr.skip(), self._status("bad", "Load failed", reason, self._still_serving(session)),
                   gr.Button(interactive=True, value="Apply"), session, self.pool_summary(session))
            return
        session.config = config
        session.extras = dict(extras or {})
        detail = (f"weights {format_bytes(stats.get('weights_bytes'))} · "
                  f"KV cache {format_bytes(stats.get('kv_cache_bytes'))}")
        title = (f"Sharing the loaded engine (its load took {load_seconds:.1f} s)" if shared
                 else f"Loaded in {load_seconds:.1f} s")
        notices = "".join(f"<li>{_escape(n)}</li>" for n in info.get("notices") or [])
        yield (header_html(self.device, config, info, load_seconds),
               self._status("ok", title, detail, f"<ul>{notices}</ul>" if notices else ""),
               gr.Button(interactive=True, value="Apply"), session, self.pool_summary(session))

    def preset(self, name: str, session: Session) -> tuple:
        """Fill the panel from an optimization preset, on top of the session's configuration.

        Returns the panel's values, the preset fields that have no control, and a note saying
        what the preset is; the caller chains `apply`.
        """
        preset = load_preset(name)
        form = config_to_form({**(session or self.new_session()).config, **preset}, self.curated)
        extras = {k: v for k, v in preset.items() if k not in FORM_FIELDS and k != "kv_cache_bytes"}
        note = f'<div class="check ok">preset <b>{_escape(name)}</b>: {_escape(preset_description(name))}</div>'
        return (*[form[f] for f in FORM_FIELDS], extras, note)

    def page_load(self, session: Session) -> tuple:
        """Fill the header and the panel for a new tab from its session's configuration."""
        session = session or self.new_session()
        form = config_to_form(session.config, self.curated)
        return (self.header(session), *[form[f] for f in FORM_FIELDS], session, self.pool_summary(session))

    def header(self, session: Session) -> str:
        """The header for this session's configuration, with what `auto` resolved to once loaded."""
        with self.pool.lease_if_loaded(session.config) as entry:
            info = dict(entry.engine.info) if entry else None
            load_seconds = entry.load_seconds if entry else None
        return header_html(self.device, session.config, info, load_seconds)

    # ----- chat ----------------------------------------------------------------------------

    def chat(self, message: str, max_new_tokens: float, temperature: float, session: Session) -> Iterator[tuple]:
        """Stream one reply. Yields (chat, textbox, session, figures, *charts).

        The chat text updates as tokens arrive, the charts every CHART_REFRESH_S; the reply
        ends with its own figures. Stopping closes the stream, which cancels the request.
        """
        session = session or self.new_session()
        message = (message or "").strip()
        if not message:
            yield (session.display, "", session, session.last_figures, *self._no_chart_update())
            return
        max_tokens = max(1, min(int(max_new_tokens), self.settings.max_new_tokens))
        params = SamplingParams(max_tokens=max_tokens, temperature=float(temperature))
        session.display = [*session.display, {"role": "user", "content": message},
                           {"role": "assistant", "content": '<span class="thinking">waiting for the engine…</span>'}]
        yield (session.display, "", session, gr.skip(), *self._no_chart_update())

        text, metrics, finish, error = "", None, None, None
        speculative = session.config["speculative"] != "off"
        session.streaming = True
        try:
            with self.pool.lease(session.config) as entry:
                engine = entry.engine
                messages = session.history + [{"role": "user", "content": message}]
                tokenizer = engine.tokenizer
                if tokenizer is None:
                    raise EngineError("this model has no tokenizer, so it cannot chat (the engine still "
                                      "serves token-id prompts through its API)")
                messages = fit_history(messages, lambda m: count_prompt_tokens(tokenizer, m),
                                       self.settings.max_prompt_tokens)
                stream = engine.stream(as_prompt(tokenizer, messages), params)
                last_text = last_chart = 0.0
                try:
                    for delta in stream:
                        text += delta.text
                        metrics = delta.metrics
                        if delta.finished:
                            finish, error = delta.finish_reason, getattr(delta, "error", None)
                        now = time.perf_counter()
                        if now - last_text < TEXT_REFRESH_S and not delta.finished:
                            continue
                        last_text = now
                        session.display[-1] = {"role": "assistant",
                                               "content": _escape(text) + _live_figures(metrics, speculative)}
                        chart_update = self._no_chart_update()
                        if now - last_chart >= CHART_REFRESH_S:
                            last_chart = now
                            chart_update = self.chart_frames(session, engine)
                        yield (session.display, "", session, gr.skip(), *chart_update)
                finally:
                    stream.close()
        except Exception as failure:  # shown in the reply; the engine itself keeps serving
            finish = "error"
            error = str(failure) if isinstance(failure, EngineError | PromptTooLong) else (
                f"{type(failure).__name__}: {failure}")
        finally:
            self._finish_turn(session, message, text, metrics, finish or "cancelled", error, speculative)
            session.streaming = False
        yield (session.display, message if finish == "error" else "", session, session.last_figures,
               *self.chart_frames(session))

    def stopped(self, session: Session) -> tuple:
        """After Stop: show the reply as it was when the request was cancelled, with its figures."""
        deadline = time.monotonic() + 2.0
        while session is not None and session.streaming and time.monotonic() < deadline:
            time.sleep(0.02)
        session = session or self.new_session()
        return (session.display, session, session.last_figures, *self.chart_frames(session))

    def clear(self, session: Session) -> tuple:
        session = session or self.new_session()
        session.history, session.display, session.last_figures = [], [], None
        return session.display, session, None

    def _finish_turn(self, session: Session, message: str, text: str, metrics, finish: str,
                     error: str | None, speculative: bool) -> None:
        figures = reply_figures(metrics, speculative) if metrics is not None else {
            "ttft_ms": None, "decode_tokens_per_s": None, "prompt_tokens": 0, "output_tokens": 0,
            "cached_tokens": 0}
        figures["finish_reason"] = finish
        if error:
            figures["error"] = error
        session.last_figures = figures
        body = _escape(text) if text else ""
        if error:
            body += f'\n\n<div class="reply-error">✕ {_escape(error)}</div>'
        session.display[-1] = {"role": "assistant", "content": body + figures_html(figures, finish)}
        if text and finish != "error":
            session.history = session.history + [{"role": "user", "content": message},
                                                 {"role": "assistant", "content": text}]
        session.turns = session.turns + [{"turn": len(session.turns) + 1, "ttft_ms": figures["ttft_ms"],
                                          "config": _short_config(session.config)}]

    # ----- charts and pool -----------------------------------------------------------------

    def chart_frames(self, session: Session, engine=None) -> tuple:
        """The five chart data frames, from the engine serving this session (if it is loaded)."""
        session = session or self.new_session()
        if engine is None:
            with self.pool.lease_if_loaded(session.config) as entry:
                return self._frames(session, entry.engine if entry else None)
        return self._frames(session, engine)

    def refresh(self, session: Session) -> tuple:
        """Timer tick: the charts, the pool summary and the header."""
        session = session or self.new_session()
        return (*self.chart_frames(session), self.pool_summary(session), self.header(session))

    def _frames(self, session: Session, engine) -> tuple:
        now = time.perf_counter()
        steps, stats = [], None
        if engine is not None:
            steps = engine.step_history(since=now - charts.WINDOW_S)
            stats = engine.stats()
            session.kv_samples = charts.trim_samples(session.kv_samples, now) + [charts.kv_sample(stats, now)]
        frames = (charts.ttft_frame(session.turns), charts.throughput_frame(steps, now), charts.memory_frame(stats),
                  charts.kv_blocks_frame(session.kv_samples, now), charts.batch_frame(steps, now))
        # An empty frame is not sent: gradio's plots do not recover from a first render without data.
        return tuple(gr.skip() if frame.empty else frame for frame in frames)

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
            lines.append(f'<div class="pool-entry{marker}"><span>{_escape(_short_config(config))}</span>'
                         f'<span>{format_bytes(entry.size_bytes)} · {users}</span></div>')
        if not entries:
            lines.append('<div class="pool-entry">no engine loaded yet</div>')
        return "".join(lines)

    @staticmethod
    def _no_chart_update() -> tuple:
        return tuple(gr.skip() for _ in charts.ALL_CHARTS)

    def _still_serving(self, session: Session) -> str:
        return f"Still serving: {_short_config(session.config)}" if session else ""

    @staticmethod
    def _status(kind: str, title: str, detail: str, extra: str) -> str:
        return (f'<div class="apply-status {kind}"><div class="apply-title">{_escape(title)}</div>'
                f'<div class="apply-detail">{_escape(detail)}</div>{extra if kind == "ok" else _escape(extra)}</div>')


def _short_config(config: dict) -> str:
    parts = [model_label(config["model"]), config["dtype"]]
    for name, default in (("quantization", "none"), ("speculative", "off")):
        if config[name] != default:
            parts.append(config[name])
    parts.append(config["kv_layout"] + ("+prefix" if config["prefix_caching"] else ""))
    parts.append(f"{config['batching']}×{config['max_num_seqs']}")
    return " ".join(parts)


def _live_figures(metrics, speculative: bool) -> str:
    if metrics is None:
        return ""
    return figures_html(reply_figures(metrics, speculative)).replace("msg-figures", "msg-figures live", 1)


def _escape(text: str) -> str:
    """Model and error text is shown as Markdown/HTML but must not inject markup."""
    return html.escape(text, quote=False)
