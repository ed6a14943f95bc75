"""The chat tab: the conversation with the engine, its per-reply figures, and the live charts beside it."""
