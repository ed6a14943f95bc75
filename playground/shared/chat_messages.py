"""Chat messages that come from outside (an OpenAI request's `messages`, a benchmark's uploaded prompts), checked
one way: the roles the server understands, text content (or text parts), and bounded sizes.

Why: the OpenAI routes and the Benchmark upload both hand messages to the engine, and what one of them refuses the
other must refuse too. Sizes are checked in characters, before anything is tokenised: each message against
PLAYGROUND_MAX_MESSAGE_CHARS, all of them together against PLAYGROUND_MAX_CONVERSATION_CHARS.
"""

from __future__ import annotations

from playground.shared.errors import Refused

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256


def parse_messages(messages, max_messages: int, max_message_chars: int, max_total_chars: int) -> list[dict]:
    """[{"role", "content"}] with text content, or Refused (field "messages") naming the first problem."""
    if not isinstance(messages, list) or not messages or len(messages) > max_messages:
        raise Refused(f"messages must be a list of 1 to {max_messages} messages", "messages")
    cleaned, total = [], 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise Refused(f"each message needs a role among {', '.join(ROLES)}", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is understood here
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise Refused("only text content parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise Refused("each message's content must be text", "messages")
        if len(content) > max_message_chars:
            raise Refused(f"a message is {len(content):,} characters; this server takes at most {max_message_chars:,}"
                          " (PLAYGROUND_MAX_MESSAGE_CHARS)", "messages")
        total += len(content)
        if total > max_total_chars:
            raise Refused(f"the conversation is over {max_total_chars:,} characters, this server's limit "
                          "(PLAYGROUND_MAX_CONVERSATION_CHARS)", "messages")
        cleaned.append({"role": message["role"], "content": content})
    return cleaned
