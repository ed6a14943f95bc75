"""The Compare tab: its layout, its wiring, and the glue between its controls and `CompareHandlers`.

Every control has an element id (`cmp-...`) that the glossary names for its tooltip. Events that
measure share one concurrency slot with the Benchmark tab ("measure"), so two measurements never
run at once on this server; Stop bypasses the queue. `/compare` serves API clients the comparison as
plain data (the same dict the tab renders).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import TYPE_CHECKING

import gradio as gr

from playground.chat import render_chat
from playground.compare import BASELINE, FIGURES, PANEL, CompareRequest
from playground.conversation import Conversation
from playground.errors import Refused, describe_error
from playground.figures import config_summary
from playground.params import parse_sampling
from playground.run_charts import CHARTS_NOTE, RUN_CHARTS, run_charts_html
from playground.run_views import compare_outputs_html, compare_table_html, notice_html, progress_html
from playground.session import pack

if TYPE_CHECKING:
    from playground.handlers import Playground

DEFAULT_PROMPTS = "What does json.dumps do?\nHow do I use pathlib.Path?"
DEFAULT_B = "speculative-draft"
INPUTS = ("cmp_a_source", "cmp_a_changes", "cmp_b_source", "cmp_b_changes", "cmp_prompts", "cmp_max_tokens",
          "cmp_temperature", "cmp_top_p", "cmp_top_k", "cmp_seed", "cmp_repeats", "cmp_baseline", "cmp_perplexity")
SIDE_INPUTS = ("cmp_a_source", "cmp_a_changes", "cmp_b_source", "cmp_b_changes", "cmp_baseline")
CHART_OUTPUTS = tuple(f"cmp_{spec.name}" for spec in RUN_CHARTS)
RUN_OUTPUTS = ("cmp_status", "cmp_table", "cmp_outputs", "cmp_run", *CHART_OUTPUTS)
CHAT_OUTPUTS = ("cmp_chat_a", "cmp_chat_b", "cmp_chat_baseline", "cmp_message", "cmp_notice")
# element id -> glossary term, for the tooltips
TOOLTIPS = {"cmp-a-source": "compare_side", "cmp-b-source": "compare_side", "cmp-a-changes": "compare_changes",
            "cmp-b-changes": "compare_changes", "cmp-prompts": "compare_prompts", "cmp-max-tokens": "max_tokens",
            "cmp-temperature": "temperature", "cmp-top-p": "top_p", "cmp-top-k": "top_k", "cmp-seed": "sample_seed",
            "cmp-repeats": "compare_repeats", "cmp-baseline": "compare_baseline",
            "cmp-perplexity": "compare_perplexity", "cmp-chat": "chat_both"}


class CompareTab:
    """The tab's event handlers: parse the controls, run `app.compare`, render what it returns."""

    def __init__(self, app: Playground):
        self.app = app
        self.compare = app.compare

    def _request(self, values: tuple) -> tuple[CompareRequest, object]:
        *controls, extras, session = values
        inputs, form = controls[:len(INPUTS)], controls[len(INPUTS):]
        return self.compare.parse(*inputs, self.compare.panel_config(form, extras)), self.app.session_of(session)

    def describe(self, *values) -> tuple[str, str, str]:
        """The live line under each side: the configuration it resolves to, or why it cannot run."""
        *controls, extras, session = values
        a_source, a_changes, b_source, b_changes, baseline = controls[:len(SIDE_INPUTS)]
        lines = []
        try:
            panel = self.compare.panel_config(controls[len(SIDE_INPUTS):], extras)
        except Refused as error:
            bad = self._line("bad", f"the engine panel: {error}")
            return bad, bad, ""
        configs = {}
        for label, source, changes in (("A", a_source, a_changes), ("B", b_source, b_changes)):
            try:
                configs[label] = self.compare.side_config(source, changes, panel)
                lines.append(self._line("ok", config_summary(configs[label])))
            except Exception as error:  # any refusal of the engine or the playground, as one line
                lines.append(self._line("bad", describe_error(error, self.app.settings.public)))
        base = ""
        if baseline is True and "A" in configs:
            base = self._line("ok", "baseline: " + config_summary(self.compare.baseline_config(configs["A"])))
        return lines[0], lines[1], base

    @staticmethod
    def _line(kind: str, text: str) -> str:
        return f'<div class="check {kind}">{"✓" if kind == "ok" else "✕"} {html.escape(text)}</div>'

    def run(self, *values) -> Iterator[tuple]:
        """Run: the progress while it runs, then the table, the outputs with their differences, the charts."""
        try:
            request, session = self._request(values)
            jobs = self.compare.run(request, session)
            idle = gr.Button(value="Run comparison", interactive=True)
            busy = gr.Button(value="Comparing…", interactive=False)
            total = request.repeats * len(request.sides)
            for job in jobs:
                if job.done.is_set():
                    break
                yield pack(RUN_OUTPUTS, {"cmp_status": progress_html(job, "comparison", job.runs_done, total),
                                         "cmp_run": busy})
            outcome = self.compare.outcome(request, job)
        except Refused as refusal:
            yield pack(RUN_OUTPUTS, {"cmp_status": notice_html("bad", str(refusal)),
                                     "cmp_run": gr.Button(value="Run comparison", interactive=True)})
            return
        session.compare.last = outcome
        if not outcome["labels"]:
            yield pack(RUN_OUTPUTS, {"cmp_status": notice_html("info", "stopped before A finished: nothing to show"),
                                     "cmp_run": idle})
            return
        status = "stopped: figures of the runs that finished" if outcome["cancelled"] else \
            f"done in {job.seconds:.1f} s"
        yield pack(RUN_OUTPUTS, {
            "cmp_status": notice_html("info" if outcome["cancelled"] else "ok", status),
            "cmp_table": compare_table_html(outcome, FIGURES), "cmp_outputs": compare_outputs_html(outcome),
            "cmp_run": idle, **dict(zip(CHART_OUTPUTS, run_charts_html(self.compare.timelines(job)), strict=True)),
        })

    def api_compare(self, a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature, top_p, top_k,
                    seed, repeats, baseline, perplexity, session) -> dict:
        """`/compare` for API clients: the finished comparison as plain data; a refusal raises gr.Error.

        "engine panel" is this client's active configuration (the one `/apply` loaded, else the default).
        """
        session = self.app.session_of(session)
        try:
            request = self.compare.parse(a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature,
                                         top_p, top_k, seed, repeats, baseline, perplexity, dict(session.config))
            for job in self.compare.run(request, session):
                if job.done.is_set():
                    break
            outcome = self.compare.outcome(request, job)
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        session.compare.last = outcome
        return outcome

    # ----- chat with both ----------------------------------------------------------------------

    def _chat_view(self, session, labels: tuple[str, ...]) -> dict:
        chats = session.compare.chats
        views = {}
        for label, name in (("A", "cmp_chat_a"), ("B", "cmp_chat_b"), (BASELINE, "cmp_chat_baseline")):
            views[name] = gr.Chatbot(value=render_chat(chats.get(label, Conversation())), visible=label in labels)
        return views

    def chat_send(self, message, *values) -> Iterator[tuple]:
        """Chat with both: the message to every side, each reply streaming in its own column."""
        *controls, extras, session = values
        session = self.app.session_of(session)
        a_source, a_changes, b_source, b_changes, baseline, max_tokens, temperature, top_p, top_k, seed = controls[:10]
        try:
            if not isinstance(message, str) or not message.strip():
                raise Refused("type a message first")
            if len(message) > self.app.settings.max_message_chars:
                raise Refused(f"the message is over {self.app.settings.max_message_chars:,} characters")
            if session.compare.chat_streaming:
                raise Refused("the previous message is still streaming: wait for it or press Stop")
            panel = self.compare.panel_config(controls[10:], extras)
            sides = self.compare.sides(a_source, a_changes, b_source, b_changes, baseline, panel)
            params = parse_sampling(self.app.settings, max_tokens, temperature, top_p, top_k, seed)
        except Exception as error:  # refused input or configuration: nothing is sent
            yield pack(CHAT_OUTPUTS, {"cmp_notice": notice_html("bad", describe_error(error,
                                                                                      self.app.settings.public))})
            return
        labels = tuple(side.label for side in sides)
        yield pack(CHAT_OUTPUTS, {**self._chat_view(session, labels), "cmp_message": "", "cmp_notice": ""})
        for _ in self.compare.chat_both(message.strip(), sides, params, session):
            yield pack(CHAT_OUTPUTS, self._chat_view(session, labels))
        yield pack(CHAT_OUTPUTS, self._chat_view(session, labels))

    def chat_clear(self, session) -> tuple:
        session = self.app.session_of(session)
        session.compare.chats = {}
        return pack(CHAT_OUTPUTS, {**self._chat_view(session, ("A", "B")), "cmp_notice": ""})


def build_compare_tab(app: Playground, ui: dict) -> CompareTab:
    """The Compare tab's components, added to `ui` under their names (wired by `wire_compare_tab`)."""
    tab = CompareTab(app)
    settings = app.settings
    sources = [PANEL, *app.presets]
    gr.HTML('<div class="tab-intro">Two configurations on the same prompts, with the same seed and sampling: each '
            'side runs alone (never interleaved), repeats alternate the order, and the table gives B / A. Both '
            'engines come from the shared pool, under its memory budget.</div>')
    with gr.Row(equal_height=False, elem_id="cmp-sides"):
        for side, default in (("a", PANEL), ("b", DEFAULT_B if DEFAULT_B in app.presets else PANEL)):
            with gr.Column(elem_classes=["cmp-side"], min_width=280):
                ui[f"cmp_{side}_source"] = gr.Dropdown(sources, value=default, label=f"{side.upper()}: start from",
                                                       elem_id=f"cmp-{side}-source")
                ui[f"cmp_{side}_changes"] = gr.Textbox(
                    "", label=f"{side.upper()}: changes", lines=1, max_lines=4, elem_id=f"cmp-{side}-changes",
                    placeholder="KEY=VALUE, e.g. quantization=int8, prefix_caching=false", max_length=2000)
                ui[f"cmp_{side}_resolved"] = gr.HTML(elem_id=f"cmp-{side}-resolved")
    ui["cmp_baseline_resolved"] = gr.HTML(elem_id="cmp-baseline-resolved")
    ui["cmp_prompts"] = gr.Textbox(DEFAULT_PROMPTS, label="prompts (one per line)", lines=2, max_lines=8,
                                   elem_id="cmp-prompts", max_length=8 * settings.max_message_chars)
    with gr.Row(elem_id="cmp-sampling"):
        ui["cmp_max_tokens"] = gr.Slider(1, settings.max_new_tokens, value=min(48, settings.max_new_tokens), step=1,
                                         label="max_tokens", elem_id="cmp-max-tokens")
        ui["cmp_temperature"] = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="temperature",
                                          elem_id="cmp-temperature")
        ui["cmp_top_p"] = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top_p", elem_id="cmp-top-p")
        ui["cmp_top_k"] = gr.Number(value=0, label="top_k", precision=0, minimum=0, elem_id="cmp-top-k")
        ui["cmp_seed"] = gr.Number(value=0, label="seed", precision=0, minimum=0, elem_id="cmp-seed")
        ui["cmp_repeats"] = gr.Slider(1, 5, value=1, step=1, label="repeats", elem_id="cmp-repeats")
    with gr.Row(elem_id="cmp-actions"):
        ui["cmp_baseline"] = gr.Checkbox(False, label="+ transformers baseline", elem_id="cmp-baseline")
        ui["cmp_perplexity"] = gr.Checkbox(False, label="measure perplexity", elem_id="cmp-perplexity")
        ui["cmp_run"] = gr.Button("Run comparison", variant="primary", elem_id="cmp-run")
        ui["cmp_stop"] = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
    ui["cmp_status"] = gr.HTML(elem_id="cmp-status")
    ui["cmp_table"] = gr.HTML(elem_id="cmp-table")
    with gr.Row(elem_id="cmp-charts"):
        for chart, empty in zip(RUN_CHARTS, run_charts_html([]), strict=True):
            ui[f"cmp_{chart.name}"] = gr.HTML(empty, elem_id=f"cmp-chart-{chart.name}", elem_classes=["run-chart"])
    gr.HTML(f'<div class="run-note">{CHARTS_NOTE}</div>')
    ui["cmp_outputs"] = gr.HTML(elem_id="cmp-outputs")
    with gr.Accordion("Chat with both", open=False, elem_id="cmp-chat"):
        with gr.Row(equal_height=False):
            for label, name in (("A", "cmp_chat_a"), ("B", "cmp_chat_b"), ("baseline", "cmp_chat_baseline")):
                ui[name] = gr.Chatbot(label=label, height=320, elem_id=name.replace("_", "-"), sanitize_html=True,
                                      layout="bubble", visible=label != "baseline", buttons=["copy"])
        ui["cmp_notice"] = gr.HTML(elem_id="cmp-notice")
        with gr.Row():
            ui["cmp_message"] = gr.Textbox(show_label=False, placeholder="Message A and B… (Enter to send)", scale=8,
                                           elem_id="cmp-message", max_length=settings.max_message_chars)
            ui["cmp_send"] = gr.Button("Send to both", variant="primary", scale=1, elem_id="cmp-send")
            ui["cmp_chat_clear"] = gr.Button("Clear", scale=1, elem_id="cmp-chat-clear")
    return tab


def wire_compare_tab(tab: CompareTab, ui: dict, form: list, extras, session) -> None:
    """The tab's events; `/compare` for API clients."""
    private = {"api_visibility": "private"}
    measure = dict(concurrency_limit=1, concurrency_id="measure", show_progress="hidden")
    inputs = [ui[name] for name in INPUTS] + form + [extras, session]
    side_inputs = [ui[name] for name in SIDE_INPUTS] + form + [extras, session]
    resolved = [ui["cmp_a_resolved"], ui["cmp_b_resolved"], ui["cmp_baseline_resolved"]]
    for name in ("cmp_a_source", "cmp_b_source", "cmp_baseline", "cmp_a_changes", "cmp_b_changes"):
        ui[name].change(tab.describe, side_inputs, resolved, queue=False, show_progress="hidden", **private)
    ui["cmp_run"].click(tab.run, inputs, [ui[name] for name in RUN_OUTPUTS], **measure, **private)
    chat_inputs = [ui["cmp_message"], *[ui[name] for name in SIDE_INPUTS],
                   *[ui[name] for name in ("cmp_max_tokens", "cmp_temperature", "cmp_top_p", "cmp_top_k",
                                           "cmp_seed")], *form, extras, session]
    chat_outputs = [ui[name] for name in CHAT_OUTPUTS]
    gr.on([ui["cmp_message"].submit, ui["cmp_send"].click], tab.chat_send, chat_inputs, chat_outputs,
                 concurrency_limit=1, concurrency_id="measure", show_progress="hidden", **private)
    ui["cmp_stop"].click(tab.compare.stop, [session], None, queue=False, **private)
    ui["cmp_chat_clear"].click(tab.chat_clear, [session], chat_outputs, queue=False, **private)
    with gr.Group(visible=False):
        result = gr.JSON(label="comparison")
        button = gr.Button("compare")
    button.click(tab.api_compare, [ui[name] for name in INPUTS] + [session], result, api_name="compare", **measure)
