"""Backends the engine loop drives: the native engine and the `transformers` baseline, one contract."""
