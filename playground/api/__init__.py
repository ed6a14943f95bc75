"""The playground's HTTP APIs beside Gradio's own: the OpenAI-compatible routes."""
