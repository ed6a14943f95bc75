"""Guided decoding (structured outputs): a request's output held to a JSON schema, any JSON object, a regex or a
grammar by a token mask applied in the batched sampler (docs/structured-outputs.md)."""
