"""The Compare tab's handlers: the live line under each side, Run (with its progress, table, outputs and
charts), Stop, "chat with both", and `/compare` for API clients.

Why apart from the comparison: these turn the tab's controls into a `CompareRequest`, run it with
`Comparisons` or `ChatWithBoth`, and render what comes back (`playground/figures/`); the rules of a
comparison live in those.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Sequence

import gradio as gr

from playground.compare.chat_both import ChatWithBoth
from playground.compare.comparison import FIGURES, SURGE_FIGURES, Comparisons
from playground.compare.request import BASELINE, CompareRequest, ComparisonParser, parse_baseline
from playground.figures.configuration import check_html, config_summary
from playground.figures.conversation_views import render_chat
from playground.figures.run_charts import RUN_CHARTS, run_charts_html
from playground.figures.run_views import compare_outputs_html, compare_table_html, notice_html, progress_html
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import Conversation
from playground.shared.errors import Refused
from playground.shared.sampling import parse_sampling
from playground.shared.session import Session, pack

INPUTS = ("cmp_a_source", "cmp_a_changes", "cmp_b_source", "cmp_b_changes", "cmp_prompts", "cmp_max_tokens",
          "cmp_temperature", "cmp_top_p", "cmp_top_k", "cmp_seed", "cmp_repeats", "cmp_baseline", "cmp_perplexity",
          "cmp_structured", "cmp_structured_spec", "cmp_structured_sides", "cmp_surge")
SIDE_INPUTS = ("cmp_a_source", "cmp_a_changes", "cmp_b_source", "cmp_b_changes", "cmp_baseline")
STRUCTURED_INPUTS = ("cmp_structured", "cmp_structured_spec", "cmp_structured_sides")
CHAT_INPUTS = ("cmp_message", *SIDE_INPUTS, "cmp_max_tokens", "cmp_temperature", "cmp_top_p", "cmp_top_k", "cmp_seed",
               *STRUCTURED_INPUTS)
CHART_OUTPUTS = tuple(f"cmp_{spec.name}" for spec in RUN_CHARTS)
RUN_OUTPUTS = ("cmp_status", "cmp_table", "cmp_outputs", "cmp_run", *CHART_OUTPUTS)
CHAT_OUTPUTS = ("cmp_chat_a", "cmp_chat_b", "cmp_chat_baseline", "cmp_message", "cmp_notice")


def _line(kind: str, text: str) -> str:
    return check_html(kind, html.escape(text))


class CompareHandlers:
    """The tab's handlers over the context; `read_panel` reads the engine panel's values, which the tab's events
    receive after its own controls (what the "engine panel" side means on the page)."""

    def __init__(self, context: PlaygroundContext, read_panel: Callable[[Sequence, object], dict]):
        self.context = context
        self.parser = ComparisonParser(context, read_panel)
        self.comparisons = Comparisons(context)
        self.chat = ChatWithBoth(context)

    def _request(self, values: tuple) -> tuple[CompareRequest, Session]:
        *controls, extras, session = values
        inputs, form = controls[:len(INPUTS)], controls[len(INPUTS):]
        return self.parser.parse(*inputs, self.parser.panel(form, extras)), self.context.session_of(session)

    def describe(self, *values) -> tuple[str, str, str]:
        """The live line under each side: the configuration it resolves to, or why it cannot run."""
        *controls, extras, session = values
        a_source, a_changes, b_source, b_changes, baseline = controls[:len(SIDE_INPUTS)]
        lines = []
        try:
            panel = self.parser.panel(controls[len(SIDE_INPUTS):], extras)
        except Refused as error:
            bad = _line("bad", f"the engine panel: {error}")
            return bad, bad, ""
        configs = {}
        for label, source, changes in (("A", a_source, a_changes), ("B", b_source, b_changes)):
            try:
                configs[label] = self.parser.side_config(source, changes, panel)
                lines.append(_line("ok", config_summary(configs[label])))
            except Exception as error:  # any refusal of the engine or the playground, as one line
                lines.append(_line("bad", self.context.describe(error)))
        base = ""
        try:
            kind = parse_baseline(baseline)
            if kind and "A" in configs:
                base = _line("ok", "baseline: " + config_summary(self.parser.baseline_config(configs["A"], kind)))
        except Exception as error:  # the baseline's own refusal (e.g. llama.cpp not installed), as its line
            base = _line("bad", f"baseline: {self.context.describe(error)}")
        return lines[0], lines[1], base

    def run(self, *values) -> Iterator[tuple]:
        """Run: the progress while it runs, then the table, the outputs with their differences, the charts."""
        try:
            request, session = self._request(values)
            jobs = self.comparisons.run(request, session)
            idle = gr.Button(value="Run comparison", interactive=True)
            busy = gr.Button(value="Comparing…", interactive=False)
            total = request.repeats * len(request.sides)
            for job in jobs:
                if job.done.is_set():
                    break
                yield pack(RUN_OUTPUTS, {"cmp_status": progress_html(job, "comparison", job.runs_done, total),
                                         "cmp_run": busy})
            outcome = self.comparisons.outcome(request, job)
        except Refused as refusal:
            yield pack(RUN_OUTPUTS, {"cmp_status": notice_html("bad", str(refusal)),
                                     "cmp_run": gr.Button(value="Run comparison", interactive=True)})
            return
        if not outcome["labels"]:
            yield pack(RUN_OUTPUTS, {"cmp_status": notice_html("info", "stopped before A finished: nothing to show"),
                                     "cmp_run": idle})
            return
        stopped = (f"stopped at this server's cap of {self.context.settings.max_measure_seconds} s "
                   "(PLAYGROUND_MAX_MEASURE_SECONDS)" if job.place.capped else "stopped")
        status = f"{stopped}: figures of the runs that finished" if outcome["cancelled"] else \
            f"done in {job.seconds:.1f} s"
        yield pack(RUN_OUTPUTS, {
            "cmp_status": notice_html("info" if outcome["cancelled"] else "ok", status),
            "cmp_table": compare_table_html(outcome, FIGURES + SURGE_FIGURES if outcome["surge"] else FIGURES),
            "cmp_outputs": compare_outputs_html(outcome),
            "cmp_run": idle,
            **dict(zip(CHART_OUTPUTS, run_charts_html(self.comparisons.timelines(job)), strict=True)),
        })

    def stop(self, session) -> None:
        """Stop: the comparison (or the chat with both) ends cleanly at once."""
        self.comparisons.stop(session)

    def api_compare(self, a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature, top_p, top_k,
                    seed, repeats, baseline, perplexity, structured, structured_spec, structured_sides, surge,
                    session) -> Iterator[dict]:
        """`/compare` for API clients: its progress while it waits for the measurement slot and runs
        (`MeasurementJob.progress`: phase, measurements ahead, requests done), then the finished comparison as plain
        data; a refusal raises gr.Error, and a client that goes away stops it.

        "engine panel" is this client's active configuration (the one `/apply` loaded, else the default).
        """
        session = self.context.session_of(session)
        try:
            request = self.parser.parse(a_source, a_changes, b_source, b_changes, prompts, max_tokens, temperature,
                                        top_p, top_k, seed, repeats, baseline, perplexity, structured,
                                        structured_spec, structured_sides, surge, session.config.to_dict())
            for job in self.comparisons.run(request, session):
                if job.done.is_set():
                    break
                yield job.progress()
            outcome = self.comparisons.outcome(request, job)
        except Refused as refusal:
            raise gr.Error(str(refusal), print_exception=False) from None
        yield outcome

    # ----- chat with both ----------------------------------------------------------------------

    @staticmethod
    def _chat_view(session: Session, labels: tuple[str, ...]) -> dict:
        chats = session.compare.chats
        views = {}
        for label, name in (("A", "cmp_chat_a"), ("B", "cmp_chat_b"), (BASELINE, "cmp_chat_baseline")):
            views[name] = gr.Chatbot(value=render_chat(chats.get(label, Conversation())), visible=label in labels)
        return views

    def chat_send(self, message, *values) -> Iterator[tuple]:
        """Chat with both: the message to every side, each reply streaming in its own column."""
        *controls, extras, session = values
        session = self.context.session_of(session)
        settings = self.context.settings
        (a_source, a_changes, b_source, b_changes, baseline, max_tokens, temperature, top_p, top_k, seed, structured,
         structured_spec, structured_sides) = controls[:len(CHAT_INPUTS) - 1]
        try:
            if not isinstance(message, str) or not message.strip():
                raise Refused("type a message first")
            if len(message) > settings.max_message_chars:
                raise Refused(f"the message is over {settings.max_message_chars:,} characters")
            if session.compare.chat_streaming:
                raise Refused("the previous message is still streaming: wait for it or press Stop")
            panel = self.parser.panel(controls[len(CHAT_INPUTS) - 1:], extras)
            sides = self.parser.sides(a_source, a_changes, b_source, b_changes, baseline, panel, structured,
                                      structured_spec, structured_sides)
            params = parse_sampling(settings, max_tokens, temperature, top_p, top_k, seed)
        except Exception as error:  # refused input or configuration: nothing is sent
            yield pack(CHAT_OUTPUTS, {"cmp_notice": notice_html("bad", self.context.describe(error))})
            return
        labels = tuple(side.label for side in sides)
        yield pack(CHAT_OUTPUTS, {**self._chat_view(session, labels), "cmp_message": "", "cmp_notice": ""})
        for _ in self.chat.send(message.strip(), sides, params, session):
            yield pack(CHAT_OUTPUTS, self._chat_view(session, labels))
        yield pack(CHAT_OUTPUTS, self._chat_view(session, labels))

    def chat_clear(self, session) -> tuple:
        session = self.context.session_of(session)
        session.compare.chats = {}
        return pack(CHAT_OUTPUTS, {**self._chat_view(session, ("A", "B")), "cmp_notice": ""})
