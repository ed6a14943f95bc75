"""How people ask about a documented thing: training phrasings, fresh phrasings, surface forms.

Recall is only useful if it survives the way a person happens to type a question, so every
chat picks a phrasing template and a surface form (backticks or not, `()` after a callable,
`Path.read_text` for `pathlib.Path.read_text`, lower case, no final punctuation). The card's
recall check asks with FRESH_TEMPLATES, which no training chat uses, so it measures recall of
the entry rather than of a memorised question.
"""

from __future__ import annotations

import random

GENERIC_TEMPLATES = [
    "What does {name} do?",
    "What is {name}?",
    "Explain {name}.",
    "How do I use {name}?",
    "Tell me about {name}.",
    "What is {name} for?",
    "Describe {name}.",
    "What is {name} used for?",
    "How does {name} work?",
    "{name}",
    "Can you explain {name}?",
    "What's {name}?",
    "Help me understand {name}.",
    "Explain what {name} does.",
    "I need help with {name}.",
    "What do you know about {name}?",
    "Give me an overview of {name}.",
    "Summarize the documentation of {name}.",
    "When should I use {name}?",
    "Show me the docs for {name}.",
    "How to use {name}?",
    "{name} explained",
    "Documentation for {name}",
    "What does {name} mean?",
]
KIND_TEMPLATES = [
    "What does the {name} {kind} do?",
    "Explain the {name} {kind}.",
    "Tell me about the {name} {kind}.",
    "What is the {name} {kind} for?",
    "How do I use the {name} {kind}?",
]
# Used only to evaluate: no training chat is phrased like these.
FRESH_TEMPLATES = [
    "I'd like to know what {name} does.",
    "Could you describe {name} for me?",
    "Please explain {name} briefly.",
    "What's the purpose of {name}?",
    "Quick question: what is {name}?",
    "Can you tell me what {name} is for?",
    "Give me a short explanation of {name}.",
    "What should I know about {name}?",
    "I'm reading code that uses {name}. What does it do?",
    "Remind me what {name} is.",
]
CALLABLE_KINDS = ("function", "method")


def training_templates(kind: str) -> list[str]:
    """Generic phrasings, plus "the `x` function"-style ones for kinds that have a kind word."""
    if kind == "topic":
        return GENERIC_TEMPLATES
    return GENERIC_TEMPLATES + [t.replace("{kind}", kind) for t in KIND_TEMPLATES]


def name_form(kind: str, name: str, rng: random.Random) -> str:
    """One way to write `name`: with or without backticks, `()`, or the module prefix of a method."""
    if kind == "topic":
        return name if rng.random() < 0.5 else name.replace("`", "")
    parts = name.split(".")
    if kind == "method" and len(parts) > 2 and rng.random() < 0.3:
        name = ".".join(parts[-2:])
    if kind in CALLABLE_KINDS and rng.random() < 0.25:
        name += "()"
    return f"`{name}`" if rng.random() < 0.5 else name


def phrase(template: str, kind: str, name: str, rng: random.Random) -> str:
    """`template` filled with a surface form of `name`, maybe lower-cased or without its final mark."""
    question = template.format(name=name_form(kind, name, rng))
    if not template.startswith("{") and rng.random() < 0.3:
        question = question[0].lower() + question[1:]
    if question[-1] in ".?" and rng.random() < 0.3:
        question = question[:-1]
    return question


def training_questions(kind: str, name: str, count: int, salt: str = "") -> list[str]:
    """`count` training questions about `name`, fixed by a seed made of the name and `salt`."""
    rng = random.Random(f"train:{salt}:{name}")
    templates = training_templates(kind)
    return [phrase(rng.choice(templates), kind, name, rng) for _ in range(count)]


def fresh_question(kind: str, name: str, index: int) -> str:
    """An evaluation question in a phrasing no training chat uses (template chosen by `index`)."""
    rng = random.Random(f"fresh:{name}")
    return phrase(FRESH_TEMPLATES[index % len(FRESH_TEMPLATES)], kind, name, rng)
