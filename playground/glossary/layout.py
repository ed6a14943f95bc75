"""The Glossary tab: every entry of the glossary, toggles first, as one table of what it is and what it trades.

Why a tab: the tooltips show one entry where its control or figure is; the tab shows them all together,
to read before touching a knob. It has no events: its content is fixed when the page is built.
"""

from __future__ import annotations

import html

import gradio as gr

from playground.glossary.terms import FIGURES, TOGGLES


def glossary_html() -> str:
    """Every entry, toggles first, as a table of name, what it is and what it trades."""
    sections = []
    for title, entries in (("Toggles and knobs", TOGGLES), ("Figures", FIGURES)):
        rows = "".join(f'<tr id="gloss-{html.escape(key)}"><th>{html.escape(e.name)}</th><td>{html.escape(e.what)}'
                       f'</td><td>{html.escape(e.trade)}</td></tr>' for key, e in entries.items())
        sections.append(f'<h3>{title}</h3><table class="glossary"><thead><tr><th>term</th><th>what it is</th>'
                        f'<th>what it trades</th></tr></thead><tbody>{rows}</tbody></table>')
    return f'<div id="glossary">{"".join(sections)}</div>'


def build_glossary_tab() -> None:
    """The tab's content (call inside `with gr.Tab(...)`)."""
    gr.HTML(glossary_html())
