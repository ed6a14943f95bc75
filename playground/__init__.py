"""The Gradio playground over the inference engine, organised by tab.

`app.py` and `page.py` put it together (the composition root); `shared/` holds what every tab uses (the
context: engine pool, settings, sessions; parsing, conversations, loading and measuring jobs); one
folder per tab (`engine_panel/`, `chat/`, `compare/`, `benchmark/`, `roofline/`, `glossary/`), each with
its layout and its handlers; `figures/` draws charts and figures from what the engine reports; `api/`
serves the OpenAI-compatible routes.
"""
