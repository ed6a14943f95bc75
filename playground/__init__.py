"""The Gradio playground over the inference engine: layout, handlers, charts, engine pool."""
