"""`GuidedDecoding`: what a request's output must match (a JSON schema, any JSON object, a regex or a grammar).

Plain data with the checks that need no grammar library (kind, type, size), so `SamplingParams`
can carry and validate it cheaply; compiling it against a tokenizer is `engine/guided/grammars.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
