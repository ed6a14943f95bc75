"""Function tools on the chat route: `tools`, `tool_choice`, the tool turns of a conversation, and `tool_calls`.

Why this way: a model is best shown its tools in the form it was trained on, which is its chat template's, where the
template renders tools (Qwen2.5 and 3, Llama 3.1 and later, Hermes: `Engine.renders_tools`); the engine gives the
template the tool list then. The bundled demo model's template (and many small models') knows nothing of tools, so
for them the tools are rendered here, into the system message, as a short instruction: answer with only a JSON object
`{"name": ..., "arguments": {...}}` to call one. Either way a reply is a call when it is that object, bare or inside
the `<tool_call>` ... `</tool_call>` tags the Hermes-style templates ask for. `tool_choice`:

- `none` (the default without tools): the tools are not shown and the reply is text;
- `required`, or a named function: the reply is constrained while it is decoded by a JSON schema wrapping the
  function's name and its `parameters` (any of the tools for `required`), so the arguments validate against the
  function's schema; it comes back as one `tool_calls` entry with finish_reason "tool_calls";
- `auto` (the default with tools): the reply is not constrained; it is a call when the whole reply is such a JSON
  object naming one of the tools, else text. A model that never learned to call tools (the bundled demo) answers
  in text. Streaming holds back text while it could still be a call, so streamed and whole replies agree.

A reply cut by `max_tokens` before its call is complete is returned as text with finish_reason "length". Earlier
tool turns are rendered as text any template takes: an assistant's calls as the same JSON object, a `tool`
message as a user turn that starts "Result of <tool_call_id>:".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from engine import GuidedDecoding
from playground.api.errors import APIError
from playground.api.structured import Constraint, check_spec
from playground.shared.conversation import as_prompt

MAX_TOOLS = 32
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # how Hermes-style templates (Qwen2.5, 3) ask for a call
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ANY_OBJECT = {"type": "object"}
INSTRUCTION = ("You can call these functions. To call one, answer with only a JSON object "
               '{"name": <function name>, "arguments": <arguments object>}, and nothing else.\nFunctions:\n')


@dataclass(frozen=True)
class Tools:
    """The call's function tools (name -> description and parameter schema) and its tool choice."""

    functions: dict[str, dict]
    choice: str  # "none" | "auto" | "required" | "function"
    named: str | None = None  # the function tool_choice names

    @property
    def shown(self) -> bool:
        return self.choice != "none"

    def constraint(self) -> Constraint | None:
        """The JSON-schema constraint of a forced call (`required` or a named function); None otherwise."""
        if self.choice not in ("required", "function"):
            return None
        names = [self.named] if self.choice == "function" else list(self.functions)
        schemas = [_call_schema(name, self.functions[name]["parameters"]) for name in names]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        spec = json.dumps(schema, ensure_ascii=False)
        check_spec("tools", spec)
        return Constraint("tools", GuidedDecoding("json_schema", spec))

    def for_template(self) -> list[dict]:
        """The tools in OpenAI's form, as chat templates take them."""
        return [{"type": "function", "function": {"name": name, **tool}} for name, tool in self.functions.items()]

    def system_text(self) -> str:
        """The instruction and the tool list the model is shown."""
        lines = [f"- {name}: {tool['description']} Parameters (JSON schema): "
                 f"{json.dumps(tool['parameters'], ensure_ascii=False)}" for name, tool in self.functions.items()]
        return INSTRUCTION + "\n".join(lines)

    def call_of(self, text: str) -> dict | None:
        """`text` as a `tool_calls` entry when it is exactly a call of one of the tools, bare or in `<tool_call>` tags
        (None otherwise)."""
        text = text.strip()
        if text.startswith(CALL_OPEN) and text.endswith(CALL_CLOSE):
            text = text[len(CALL_OPEN):-len(CALL_CLOSE)]
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if (not isinstance(value, dict) or set(value) != {"name", "arguments"} or value["name"] not in self.functions
                or not isinstance(value["arguments"], dict) or (self.named and value["name"] != self.named)):
            return None
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": value["name"], "arguments": json.dumps(value["arguments"], ensure_ascii=False)}}


def _call_schema(name: str, parameters: dict) -> dict:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def parse_tools(body: dict) -> Tools | None:
    """The call's tools and tool choice (None without tools); APIError 400 naming the field at fault."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(body.get("parallel_tool_calls", True), bool):
        raise APIError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise APIError(400, f"tools must be a list of at most {MAX_TOOLS} tools", param="tools")
    functions = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not NAME.match(str(function.get("name", ""))):
            raise APIError(400, 'each tool must be {"type": "function", "function": {"name": ...}} with a name of '
                                "1 to 64 letters, digits, _ or -", param="tools")
        parameters = function.get("parameters", ANY_OBJECT)
        description = function.get("description", "")
        if not isinstance(parameters, dict) or not isinstance(description, str):
            raise APIError(400, f"tool {function['name']}: parameters must be a JSON schema object and description "
                                "text", param="tools")
        check_spec("tools", description + json.dumps(parameters, ensure_ascii=False))
        if function["name"] in functions:
            raise APIError(400, f"two tools are named {function['name']}", param="tools")
        functions[function["name"]] = {"description": description, "parameters": parameters or ANY_OBJECT}
    if choice is None or choice in ("none", "auto", "required"):
        return Tools(functions, choice or "auto")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and choice.get(
        "type") == "function" and isinstance(choice.get("function"), dict) else None
    if named not in functions:
        raise APIError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                            '{"name": ...}} naming one of the tools', param="tool_choice")
    return Tools(functions, "function", named)


def with_tool_turns_as_text(messages) -> list:
    """`messages` with an assistant's `tool_calls` and `tool` messages rendered as text turns (others unchanged,
    for `parse_messages` to check)."""
    if not isinstance(messages, list):
        return messages
    rendered = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not isinstance(message.get("content"), str):
                raise APIError(400, "a tool message needs tool_call_id and text content", param="messages")
            rendered.append({"role": "user", "content": f"Result of {call_id[:64]}: {message['content']}"})
        elif isinstance(message, dict) and message.get("role") == "assistant" and message.get("tool_calls"):
            rendered.append({"role": "assistant", "content": (message.get("content") or "") + _calls_text(message)})
        else:
            rendered.append(message)
    return rendered


def _calls_text(message: dict) -> str:
    calls = message["tool_calls"]
    try:
        return "".join(json.dumps({"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
                                  ensure_ascii=False) for c in calls)
    except (TypeError, KeyError, ValueError):
        raise APIError(400, "an assistant's tool_calls must each have function.name and function.arguments (JSON "
                            "text)", param="messages") from None


def encode_chat(engine, messages: list[dict], tools: Tools | None) -> list[int]:
    """The conversation's token ids: the tools shown by the model's chat template where it renders them, else in
    the system message (or in a plain transcript, for a model without a chat template)."""
    if tools is not None and tools.shown and engine.renders_tools:
        return engine.encode(messages, tools=tools.for_template())
    has_template = bool(getattr(engine.tokenizer, "chat_template", None))
    return engine.encode(as_prompt(has_template, with_tools_shown(messages, tools)))


def with_tools_shown(messages: list[dict], tools: Tools | None) -> list[dict]:
    """`messages` with the tool list added to the system message (a new one first when there is none), for a model
    whose chat template does not render tools."""
    if tools is None or not tools.shown:
        return messages
    text = tools.system_text()
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class CallStream:
    """One streamed choice's text under `auto`, `required` or a named function: text is held back while the reply
    could still be a call, so a call is sent as `tool_calls` and never as content."""

    def __init__(self, tools: Tools):
        self.tools, self.held, self.released = tools, "", False

    def feed(self, text: str) -> str:
        """The text to send as content now."""
        if self.released:
            return text
        self.held += text
        forced = self.tools.choice in ("required", "function")
        head = self.held.lstrip()
        if forced or not head or head.startswith(("{", CALL_OPEN)) or CALL_OPEN.startswith(head):
            return ""
        self.released, out, self.held = True, self.held, ""
        return out

    def finish(self, cut: bool) -> tuple[str, dict | None]:
        """(text still to send, the call) at the end of the reply; a reply `cut` by max_tokens is never a call."""
        call = None if self.released or cut else self.tools.call_of(self.held)
        return ("" if call else self.held), call
