"""Compiling a `GuidedDecoding` against the engine's tokenizer with llguidance, refusing what cannot be enforced.

Why llguidance (docs/structured-outputs.md has the measurements): it has no dependencies, takes Lark grammars,
regexes and JSON schemas directly, and refuses a JSON-schema keyword it cannot enforce ("Unimplemented keys")
unless told to be lenient, where xgrammar compiled the same schemas and ignored `uniqueItems`, `not`,
`if`/`then`, `contains` and `propertyNames`. Compiling is done once per (kind, spec) per engine (one engine, one
tokenizer) and kept in a bounded cache; each request then gets a cheap deep copy of the compiled matcher.

Compilation runs on the caller's thread (`Engine.check_guided`, also from `submit`), never in a step, so a slow or
bad schema costs its caller only. Its work is bounded by llguidance's parser limits (lexer fuel, grammar size) and
its time is checked against `MAX_COMPILE_SECONDS`; both give one `RequestError` naming the problem.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

from engine.core.grammar_state import RequestGrammar
from engine.errors import RequestError
from engine.sampling_params import GuidedDecoding

MAX_COMPILE_SECONDS = 2.0     # a grammar whose compile (and first mask) takes longer is refused
MAX_CACHED_GRAMMARS = 256     # compiled grammars kept per engine, least recently used dropped first
MAX_ERROR_CHARS = 300
# llguidance's parser limits, set here rather than left to its defaults: they bound the work of a compile
# (initial lexer fuel: ~50k units/ms; grammar size in symbols) and of every later mask (step fuel: ~14k units/ms).
PARSER_LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                     max_grammar_size=200_000, max_lexer_states=100_000)
# JSON as `json.dumps` writes it: no free whitespace, so a model cannot fill its budget with newlines, and the
# schema's own "x-guidance" options cannot switch on lenient mode (unsupported keywords ignored).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": False}
ANY_JSON_OBJECT = '{"type": "object"}'
UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled guided-decoding spec: the matcher each request copies, and what compiling it cost."""

    matcher: llguidance.LLMatcher
    compile_seconds: float

    def new_request_grammar(self) -> RequestGrammar:
        return RequestGrammar(self.matcher.deep_copy())


class GrammarCompiler:
    """Compiles guided-decoding specs for one tokenizer, caching each result (refusals included)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: frozenset[int]):
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar | RequestError] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, guided: GuidedDecoding) -> tuple[CompiledGrammar, bool]:
        """The compiled grammar of `guided` and whether it came from the cache; RequestError if it cannot be
        enforced (bad spec, an unsupported keyword, over a bound)."""
        guided.validate()
        key = (guided.kind, guided.spec)
        with self._lock:  # compiles are bounded and short: one at a time keeps the cache simple
            cached = self._cache.get(key)
            if cached is None:
                cached = self._compile(guided)
                self._cache[key] = cached
                while len(self._cache) > MAX_CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
                hit = False
            else:
                self._cache.move_to_end(key)
                hit = True
        if isinstance(cached, RequestError):
            raise RequestError(str(cached))
        return cached, hit

    def _compile(self, guided: GuidedDecoding) -> CompiledGrammar | RequestError:
        """The compiled grammar, or the refusal to give its caller (whatever the library raised, named)."""
        try:
            return self._compile_or_raise(guided)
        except RequestError as error:
            return error
        except Exception as error:  # the library refused the text in a way of its own: the caller's spec
            return RequestError(_refusal(guided, f"{type(error).__name__}: {error}"))

    def _compile_or_raise(self, guided: GuidedDecoding) -> CompiledGrammar | RequestError:
        grammar = self._grammar_text(guided)
        tokenizer = self._llg_tokenizer()
        started = time.perf_counter()
        limits = llguidance.LLParserLimits(**PARSER_LIMITS)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=limits)
        if failed:
            return RequestError(_refusal(guided, messages[0] if messages else "rejected by the grammar library"))
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
        matcher.compute_bitmask()  # the first mask builds the lexer: part of the compile, not of a step
        seconds = time.perf_counter() - started
        if matcher.is_error():
            return RequestError(_refusal(guided, matcher.get_error()))
        if seconds > MAX_COMPILE_SECONDS:
            return RequestError(f"compiling this {guided.kind} took {seconds:.1f} s, over the bound of "
                                f"{MAX_COMPILE_SECONDS:g} s: simplify it")
        return CompiledGrammar(matcher, seconds)

    @staticmethod
    def _grammar_text(guided: GuidedDecoding) -> str:
        """llguidance's grammar for the spec (JSON is checked here: llguidance takes any text)."""
        if guided.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guided.spec)
        if guided.kind == "grammar":
            return llguidance.LLMatcher.grammar_from_lark(guided.spec)
        schema = ANY_JSON_OBJECT if guided.kind == "json_object" else guided.spec
        try:
            parsed = json.loads(schema)
        except (ValueError, RecursionError) as error:
            raise RequestError(f"the JSON schema is not valid JSON: {error}"[:MAX_ERROR_CHARS]) from None
        if not isinstance(parsed, dict):
            raise RequestError(f"a JSON schema must be a JSON object, got {type(parsed).__name__}")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (tens of milliseconds)."""
        if self._tokenizer is None:
            import llguidance.hf  # imports transformers: only once guided decoding is used (preloaded by a server)

            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                               eos_token=self._eos)
            except ValueError as error:  # e.g. a slow (Python) tokenizer
                raise RequestError(f"guided decoding cannot use this model's tokenizer: {error}") from None
        return self._tokenizer


def _refusal(guided: GuidedDecoding, message: str) -> str:
    """The caller's message for a spec llguidance refused: unsupported schema keywords by name."""
    unimplemented = UNIMPLEMENTED.search(message)
    if unimplemented:
        keywords = ", ".join(name.strip().strip('"') for name in unimplemented.group(1).split(","))
        return (f"the JSON schema uses keywords that guided decoding cannot enforce: {keywords} (refused rather "
                "than ignored)")
    return f"guided {guided.kind} refused: {message.strip()}"[:MAX_ERROR_CHARS]
