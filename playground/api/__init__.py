"""The playground's HTTP APIs beside Gradio's own: the OpenAI-compatible routes, which calls they admit, their errors,
and the bounds on every HTTP request's body and the time to send it."""
