"""Speculative decoding: cheap proposers guess the next tokens, the target verifies them in one pass.

As in vLLM's v1 engine, proposing and verifying are separate parts: a proposer (`ngram.py`: prompt
lookup, no model; `draft.py`: a small model of the same vocabulary over its own paged KV cache)
only suggests tokens, and `verify.py`'s rejection rule alone decides what becomes output, so any
proposer keeps the output distribution exactly the target's. `speculator.py` is what the native
backend calls around each step; `stats.py` counts what was proposed and accepted.
"""
