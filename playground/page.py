"""The page's handlers: every tab's, composed over one context, and the page's own events that span tabs.

Why here, in the composition root: a new browser tab (`page_load`) and the page's timer (`refresh`) each
update the engine panel, the chat and its live charts at once, and Compare reads the engine panel's
values. No tab imports another; this module hands each tab what it needs from the others.
"""

from __future__ import annotations

import gradio as gr

from playground.benchmark.handlers import BenchmarkHandlers
from playground.chat.charts import CHART_NAMES, LiveCharts
from playground.chat.handlers import ChatHandlers
from playground.compare.handlers import CompareHandlers
from playground.engine_panel.form import FORM_FIELDS, read_form
from playground.engine_panel.handlers import PanelHandlers
from playground.roofline.handlers import RooflineHandlers
from playground.shared.context import PlaygroundContext
from playground.shared.session import pack

PAGE_OUTPUTS = ("header", "session", "pool", "check", "examples", "chatbot", "notice", "system_prompt", "stored",
                "export_json", "export_md", "model", *CHART_NAMES, *[f for f in FORM_FIELDS if f != "model"])
REFRESH_OUTPUTS = (*CHART_NAMES, "pool", "header")


class PageHandlers:
    """Every tab's handlers over one context, and the page's load and timer."""

    def __init__(self, context: PlaygroundContext):
        self.context = context
        self.panel = PanelHandlers(context)
        self.charts = LiveCharts(context)
        self.chat = ChatHandlers(context, self.charts)
        self.compare = CompareHandlers(context, read_panel=read_form)
        self.benchmark = BenchmarkHandlers(context)
        self.roofline = RooflineHandlers(context)

    def page_load(self, session, stored) -> tuple:
        """A new tab: header, panel, pool, the conversation kept in this browser (if any), charts."""
        session = self.context.session_of(session)
        restored = self.chat.restore(session, stored)
        form = self.panel.form_updates(session.config.to_dict())
        shown_model = form.pop("model")
        check, _ = self.panel.check_line(session.config, session)
        return pack(PAGE_OUTPUTS, {
            **form, **restored, **dict(zip(CHART_NAMES, self.charts.outputs(session), strict=True)),
            "header": self.panel.header(session), "session": session, "pool": self.panel.pool_summary(session),
            "check": check, "examples": self.panel.examples_update(session.config),
            "model": gr.update(choices=self.panel.model_choices(), value=shown_model["value"]),
        })

    def refresh(self, session) -> tuple:
        """Timer tick: the charts, the pool list and the header."""
        session = self.context.session_of(session)
        return pack(REFRESH_OUTPUTS, {**dict(zip(CHART_NAMES, self.charts.outputs(session), strict=True)),
                                      "pool": self.panel.pool_summary(session), "header": self.panel.header(session)})
