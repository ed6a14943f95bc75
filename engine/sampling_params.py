"""`SamplingParams`: how one request picks its tokens and when it stops, validated strictly.

Every value a caller can send is checked here, before the request reaches the engine loop: a
NaN or infinite temperature, a seed wider than 64 bits or thousands of stop strings must be one
clear `RequestError` for that caller, never a failure inside a step shared with other users.
Temperatures too small to sample with in float32 mean greedy. `GuidedDecoding` is the part of a
request's parameters that says what its output must match; it is plain data with the checks that need no
grammar library (kind, type, size), and compiling it against a tokenizer is `engine/guided/grammars.py`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from engine.errors import RequestError

GUIDED_KINDS = ("json_object", "json_schema", "regex", "grammar")
MAX_SPEC_CHARS = 32_768  # a schema, regex or grammar longer than this is refused before anything compiles it


@dataclass(frozen=True)
class GuidedDecoding:
    """`kind`: "json_object" | "json_schema" | "regex" | "grammar" (Lark, as llguidance takes it); `spec`: the
    JSON schema as JSON text, the regex or the grammar ("" for json_object)."""

    kind: str
    spec: str = ""

    def validate(self) -> None:
        """One RequestError naming what is wrong with the kind or the spec's type and size (not its content)."""
        if self.kind not in GUIDED_KINDS:
            raise RequestError(f"guided.kind must be one of {', '.join(GUIDED_KINDS)}, got {self.kind!r}"[:300])
        if not isinstance(self.spec, str):
            raise RequestError(f"guided.spec must be a string, got {type(self.spec).__name__}")
        if len(self.spec) > MAX_SPEC_CHARS:
            raise RequestError(f"guided.spec may have at most {MAX_SPEC_CHARS} characters, got {len(self.spec)}")
        try:
            self.spec.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("guided.spec is not valid Unicode text (it contains a lone surrogate)") from None
        if self.kind == "json_object" and self.spec:
            raise RequestError("guided.spec must be empty for kind json_object (use json_schema to give a schema)")
        if self.kind != "json_object" and not self.spec.strip():
            raise RequestError(f"guided.spec is empty: kind {self.kind} needs one")


MAX_TOP_LOGPROBS = 20  # the most alternatives a request may ask to see beside each token
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens (greedy when temperature is 0) and when it stops."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; 0: the chosen token's; k <= MAX_TOP_LOGPROBS: also the k most likely
    guided: GuidedDecoding | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif self.stop is None:
            object.__setattr__(self, "stop", ())

    def validate(self) -> SamplingParams:
        """These parameters, checked (one RequestError naming the first bad value) and normalised."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not -(2**63) <= self.seed < 2**64):
            raise RequestError(f"seed must be a 64-bit integer or None, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise RequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        self._validate_stop()
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise RequestError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if self.guided is not None:
            if not isinstance(self.guided, GuidedDecoding):
                raise RequestError(f"guided must be a GuidedDecoding or None, got {type(self.guided).__name__}")
            self.guided.validate()
            if self.ignore_eos:
                raise RequestError("ignore_eos cannot be combined with guided decoding: the grammar decides where the "
                                   "output may end")
        if 0 < self.temperature < GREEDY_BELOW_TEMPERATURE:
            return dataclasses.replace(self, temperature=0.0)
        return self

    def _validate_stop(self) -> None:
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise RequestError(f"stop must be a list of non-empty strings, got {self.stop!r}"[:300])
        if len(self.stop) > MAX_STOP_STRINGS:
            raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for stop in self.stop:
            if len(stop) > MAX_STOP_CHARS:
                raise RequestError(f"a stop string may have at most {MAX_STOP_CHARS} characters, got {len(stop)}")
            try:
                stop.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError("a stop string is not valid Unicode text (it contains a lone surrogate)") from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
