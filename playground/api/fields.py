"""The field policy of `/v1/chat/completions` and `/v1/completions`: every request field OpenAI's API reference
defines (and the vLLM extensions this server takes) is honoured, refused, or accepted and ignored, and any other
field is refused.

Why one table: a field that is quietly accepted and not done is the most common complaint about OpenAI-compatible
servers (`n` and `logprobs` silently ignored elsewhere). The table below is the whole policy: `check_fields` enforces
it before anything else reads the body, and the table in docs/api.md is generated from it
(`python -m playground.api.fields --write`; a test checks the two agree). Honoured fields are parsed where they are
used (`openai.py`, `choices.py`, `structured.py`); this module only decides which fields may be present.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from playground.api.errors import APIError

HONOURED, REFUSED, IGNORED = "honoured", "refused", "ignored"
CHAT, TEXT = "chat", "text"
BOTH = (CHAT, TEXT)
MAX_IGNORED_TEXT = 512  # an ignored string field's length cap (`user`, `safety_identifier`, ...)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BEGIN, END = "<!-- field-policy:begin (python -m playground.api.fields --write) -->", "<!-- field-policy:end -->"


@dataclass(frozen=True)
class Field:
    """One request field: the routes that define it, what this server does with it, and why.

    A refused field is still accepted when absent or at one of its `neutral` values (`presence_penalty: 0` asks
    for nothing this server would have to do). An ignored field must have one of the JSON types in `shape`.
    """

    name: str
    routes: tuple[str, ...]
    policy: str
    why: str
    neutral: tuple = ()
    shape: tuple[type, ...] = ()
    vllm: bool = False  # a vLLM extension, not in OpenAI's reference


def _honoured(name: str, why: str, routes=BOTH, vllm: bool = False) -> Field:
    return Field(name, routes, HONOURED, why, vllm=vllm)


def _refused(name: str, why: str, neutral: tuple = (), routes=BOTH, vllm: bool = False) -> Field:
    return Field(name, routes, REFUSED, why, (None, *neutral), vllm=vllm)


def _ignored(name: str, why: str, shape: tuple[type, ...], routes=(CHAT,)) -> Field:
    return Field(name, routes, IGNORED, why, shape=(type(None), *shape))


POLICY: tuple[Field, ...] = (
    _honoured("model", "a model name, optionally `@preset`; unknown or not loadable here: 404 `model_not_found`"),
    _honoured("messages", "text parts, system/user/assistant/tool turns; image and audio parts are refused",
              routes=(CHAT,)),
    _honoured("prompt", "a string, token ids, or a list of up to 16 of those", routes=(TEXT,)),
    _honoured("max_tokens", "the reply's token budget, capped by `PLAYGROUND_MAX_NEW_TOKENS`"),
    _honoured("max_completion_tokens", "taken before `max_tokens`", routes=(CHAT,)),
    _honoured("temperature", "0 to 2; 0 is greedy"),
    _honoured("top_p", "nucleus sampling"),
    _honoured("seed", "reproducible sampling; choice i > 0 of `n` gets a seed derived from it"),
    _honoured("stop", "up to 4 strings; the reply ends before the first"),
    _honoured("stream", "server-sent events ending with `data: [DONE]`"),
    _honoured("stream_options", "`include_usage`: a last chunk with `usage`"),
    _honoured("n", "n choices per prompt (at most 8), one engine request each, sharing the prompt's KV blocks"),
    _honoured("logprobs", "chat: true/false; completions: 0-20 alternatives; of the raw logits (before "
                          "temperature, as vLLM reports them)"),
    _honoured("top_logprobs", "0-20 alternatives per token (5 on a public server)", routes=(CHAT,)),
    _honoured("response_format", "`text`, `json_object`, `json_schema` (`strict` or not), enforced by a grammar "
                                 "while decoding", routes=(CHAT,)),
    _honoured("tools", "function tools, shown by the model's chat template where it renders tools, else in the system "
              "message; calls come back as `tool_calls`",
              routes=(CHAT,)),
    _honoured("tool_choice", "`none`, `auto`, `required` or a named function; `required` and a named function are "
                             "enforced by a JSON-schema grammar", routes=(CHAT,)),
    _honoured("parallel_tool_calls", "a reply makes at most one call, which both values allow", routes=(CHAT,)),
    _honoured("top_k", "sample from the k most likely tokens (0: off)", vllm=True),
    _honoured("ignore_eos", "generate `max_tokens` tokens whatever the model says", vllm=True),
    _honoured("guided_json", "a JSON schema the reply follows (vLLM's older name of `structured_outputs.json`)",
              vllm=True),
    _honoured("guided_regex", "a regular expression the reply matches", vllm=True),
    _honoured("guided_choice", "the reply is exactly one of these strings", vllm=True),
    _honoured("guided_grammar", "a Lark grammar the reply follows", vllm=True),
    _honoured("structured_outputs", "vLLM's newer form: one of `json`, `regex`, `choice`, `grammar`, `json_object`",
              vllm=True),
    _refused("frequency_penalty", "the sampler has no penalties", (0, 0.0)),
    _refused("presence_penalty", "the sampler has no penalties", (0, 0.0)),
    _refused("logit_bias", "the sampler takes no per-token bias", ({},)),
    _refused("best_of", "no server-side ranking of candidates; ask for `n` and rank them yourself", (1,),
             routes=(TEXT,)),
    _refused("echo", "the engine does not score the prompt's tokens", (False,), routes=(TEXT,)),
    _refused("suffix", "no fill-in-the-middle", ("",), routes=(TEXT,)),
    _refused("audio", "text models only", routes=(CHAT,)),
    _refused("modalities", "text models only", (["text"],), routes=(CHAT,)),
    _refused("functions", "deprecated by OpenAI: send `tools`", ([],), routes=(CHAT,)),
    _refused("function_call", "deprecated by OpenAI: send `tool_choice`", ("none",), routes=(CHAT,)),
    _refused("reasoning_effort", "these models do not reason before answering (OpenAI refuses it for such "
                                 "models too)", routes=(CHAT,)),
    _refused("verbosity", "no reasoning model here to make terser or wordier", ("medium",), routes=(CHAT,)),
    _refused("web_search_options", "no web search here", routes=(CHAT,)),
    _refused("moderation", "no moderation is run here: ignoring it would skip a check the caller asked for",
             routes=(CHAT,)),
    _refused("service_tier", "one tier here; a faster or cheaper one cannot be promised", ("auto", "default"),
             routes=(CHAT,)),
    _refused("prediction", "no predicted-output decoding (its rejected tokens would be reported as if it ran)",
             routes=(CHAT,)),
    _refused("min_tokens", "the sampler cannot hold back EOS", (0,), vllm=True),
    _refused("min_p", "the sampler has no min-p filter", (0, 0.0), vllm=True),
    _refused("repetition_penalty", "the sampler has no penalties", (1, 1.0), vllm=True),
    _ignored("user", "an end-user id for OpenAI's abuse monitoring; there are no accounts here", (str,), routes=BOTH),
    _ignored("safety_identifier", "the same, under its newer name", (str,)),
    _ignored("metadata", "tags for stored completions; nothing is stored here", (dict,)),
    _ignored("store", "nothing is stored here, whatever it says", (bool,)),
    _ignored("prompt_cache_key", "a routing hint for OpenAI's cache; the prefix cache here matches the tokens "
                                 "themselves", (str,)),
    _ignored("prompt_cache_retention", "the prefix cache here keeps blocks until the memory is needed", (str,)),
    _ignored("prompt_cache_options", "the same (breakpoints and lifetimes have no meaning for it)", (dict,)),
)
BY_NAME = {(field.name, route): field for field in POLICY for route in field.routes}


def check_fields(body: dict, route: str) -> None:
    """APIError 400 naming the first field of `body` this route does not define, refuses, or ignores but that has
    the wrong type."""
    for name, value in body.items():
        field = BY_NAME.get((name, route))
        if field is None:
            known = sorted(f.name for f in POLICY if route in f.routes)
            raise APIError(400, f"unknown field {name[:60]!r}: this route takes {', '.join(known)}",
                           param=name[:60])
        if field.policy == REFUSED and value not in field.neutral:
            raise APIError(400, f"{name} is not supported by this server: {field.why}", param=name)
        if field.policy == IGNORED and value is not None:
            if not isinstance(value, field.shape) or isinstance(value, bool) != (bool in field.shape):
                raise APIError(400, f"{name} must be {' or '.join(t.__name__ for t in field.shape[1:])} "
                                    "(it is accepted and not used)", param=name)
            if isinstance(value, str | dict) and len(value) > MAX_IGNORED_TEXT:
                raise APIError(400, f"{name} may be at most {MAX_IGNORED_TEXT} long", param=name)


def _whole(value):
    """0.0 as 0, so that a neutral 0 / 0.0 pair is shown once."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def markdown_table() -> str:
    """The policy as the Markdown table docs/api.md shows."""
    routes = {CHAT: "chat", TEXT: "completions"}
    lines = ["| field | routes | policy | why |", "| --- | --- | --- | --- |"]
    for field in POLICY:
        policy = field.policy
        neutral = list(dict.fromkeys(json.dumps(_whole(v)) for v in field.neutral if v is not None))
        if field.policy == REFUSED and neutral:
            policy = f"refused unless {' or '.join(f'`{v}`' for v in neutral)}"
        name = f"`{field.name}`" + (" (vLLM)" if field.vllm else "")
        lines.append(f"| {name} | {', '.join(routes[r] for r in field.routes)} | {policy} | {field.why} |")
    return "\n".join(lines)


def docs_with_table(text: str) -> str:
    """docs/api.md's text with the generated table between its markers."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{DOCS.name} has no {BEGIN} ... {END} markers")
    return pattern.sub(lambda _: f"{BEGIN}\n{markdown_table()}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the OpenAI field policy table, or write it into docs/api.md.")
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {DOCS}")
    args = parser.parse_args(argv)
    if args.write:
        DOCS.write_text(docs_with_table(DOCS.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
