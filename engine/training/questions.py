"""How people ask about a documented thing: training phrasings, fresh phrasings, surface forms.

Recall is only useful if it survives the way a person happens to type a question, so every
chat picks a phrasing template and a surface form (backticks or not, `()` after a callable,
`Path.read_text` for `pathlib.Path.read_text`, lower case, no final punctuation), and some
training questions come with a greeting or an aside around them, so the model learns to key
its answer on the name and ignore the rest. Two more kinds of variety serve the same end:
requests composed from a lead and a tail (COMPOSED_TEMPLATES), and stray filler words
dropped between a question's words (`with_fillers`). The recall pass adds the bluntest kind:
scattered questions, the name among a few words drawn at random from the training phrasings
(`scattered_questions`), so that no framing at all is needed to find the entry. The card's
recall check asks with FRESH_TEMPLATES, which no training chat uses and none of whose words a
scattered question contains, so it measures recall of the entry rather than of a memorised question.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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
    "Explain {name} to me.",
    "What does {name} return?",
    "How is {name} used in practice?",
    "Explain {name} in a few words.",
    "What is {name} good for?",
    "How would I use {name} in my code?",
    "Explain {name}, please.",
    "Tell me what {name} does.",
    "{name} - what is it?",
    "Docs for {name}?",
    "Any idea what {name} does?",
    "I don't get {name}. Help?",
    "Need a summary of {name}.",
    "What is the point of {name}?",
    "Why would I use {name}?",
    "{name}: what does it do?",
    "{name}?",
    "Is {name} worth using?",
    "Wondering what {name} is.",
    "I keep seeing {name}. What is it?",
    "I came across {name} in a script. What is it for?",
    "My code calls {name}. What does that do?",
    "Brief description of {name}, please.",
    "Tell me the gist of {name}.",
    "In one sentence, what is {name}?",
    "I'm curious about {name}.",
    "What exactly is {name}?",
    "So what does {name} actually do?",
    "Do you know what {name} is?",
    "How would you sum up {name}?",
    "Looking for info on {name}.",
    "Can I get an explanation of {name}?",
    "Help with {name} please",
    "Teach me {name}.",
    "What's the role of {name}?",
    "My teacher mentioned {name}. What is that?",
    "There is {name} in this file, what is it doing?",
    "What is {name} in Python?",
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
# A second set used only to evaluate: everyday phrasings of the kind people type, none used by a training chat.
EVERYDAY_TEMPLATES = [
    "how can I use {name}",
    "What would I use {name} for?",
    "Could you explain {name}?",
    "explain how {name} works",
    "Please tell me about {name}.",
    "What is {name} meant for?",
    "can you summarise {name}",
    "What does {name} do exactly?",
    "I have a question about {name}.",
    "Explain briefly what {name} is.",
]
# How a follow-up asks about the next entry in the same conversation; training ones and, apart, evaluation ones.
FOLLOW_UP_TEMPLATES = ["And {name}?", "What about {name}?", "How about {name}?", "And what does {name} do?",
                       "Now {name}.", "Next: {name}.", "And {name}, what is that?", "Same question for {name}.",
                       "OK. And {name}?", "Then what is {name}?"]
FRESH_FOLLOW_UPS = ["Thanks. What about {name} then?", "And how about {name}?", "Also, explain {name}.",
                    "Next one: what is {name}?", "Now tell me about {name}."]
FOLLOW_UP_RATE = 0.5
# Requests as a lead and a tail: "Walk me through what {name} is."; none opens like a fresh template.
COMPOSED_LEADS = ["Explain", "Describe", "Summarize", "Clarify", "Outline", "Break down", "Walk me through",
                  "Go over", "Talk me through", "Help me with", "Tell me about", "Some background on",
                  "A few words on", "Notes on", "The basics of", "Question about", "What about", "Info on",
                  "I want to understand", "Teach me about"]
COMPOSED_TAILS = ["{name}.", "{name} for a beginner.", "{name} in Python.", "what {name} is.",
                  "the idea behind {name}.", "how {name} behaves."]
COMPOSED_TEMPLATES = [f"{lead} {tail}" for lead in COMPOSED_LEADS for tail in COMPOSED_TAILS]
# Words people scatter through a question; never the first word, so no question opens like a fresh one.
FILLERS = ["actually", "really", "exactly", "again", "basically", "here", "now", "just", "so", "um", "like",
           "the", "this", "quickly", "maybe", "ok", "hmm", "again?", "pls", "python"]
FILLER_RATE = 0.25
# Framing around a training question (never around an evaluation one).
OPENERS = ["Hi, ", "Hello! ", "Hey. ", "Python question: ", "In Python, ", "Sorry to bother you, ",
           "One more thing: ", "OK, next one. ", "Thanks! Now: ", "Stdlib question: ", "Good morning. ",
           "I'm learning Python. ", "Hi there! ", "Another question. ", "Hmm, ", "Beginner here: ",
           "So, ", "Dumb question: ", "Real quick: ", "For my homework: "]
CLOSERS = [" Thanks.", " Thanks!", " Please keep it short.", " In simple words.", " I'm new to Python.",
           " (Python 3)", " Any tips?", " I keep forgetting.", " Asking for a friend.", " Cheers",
           " It's for a script at work.", " I saw it in a tutorial.", " Short answer is fine.",
           " The docs confuse me.", " Thank you!", " I'm on Python 3.11.", " Be brief.", " No code needed.",
           " It came up in a code review.", " I have an exam tomorrow."]
FRAMING_RATE = 0.3
CALLABLE_KINDS = ("function", "method")
END_MARKS = ["", "?", ".", "!"]


def words_of(texts: list[str]) -> set[str]:
    """The words of `texts`, without surrounding punctuation or the `{name}` / `{kind}` slots."""
    return {w.strip(".?:,!()") for text in texts for w in text.split()} - {"{name}", "{kind}", ""}


# What a scattered question is made of: every word of the training phrasings that no evaluation template uses.
FRESH_WORDS = {word.lower() for word in words_of(FRESH_TEMPLATES + EVERYDAY_TEMPLATES + FRESH_FOLLOW_UPS)}
SCATTER_WORDS = sorted(
    word for word in words_of(GENERIC_TEMPLATES + KIND_TEMPLATES + COMPOSED_LEADS + COMPOSED_TAILS + FILLERS
                              + OPENERS + CLOSERS + FOLLOW_UP_TEMPLATES)
    if word.lower() not in FRESH_WORDS
)


def training_templates(kind: str) -> list[str]:
    """Generic phrasings, plus "the `x` function"-style ones for kinds that have a kind word."""
    if kind == "topic":
        return GENERIC_TEMPLATES + COMPOSED_TEMPLATES
    return GENERIC_TEMPLATES + COMPOSED_TEMPLATES + [t.replace("{kind}", kind) for t in KIND_TEMPLATES]


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


def with_fillers(template: str, rng: random.Random) -> str:
    """`template` with one or two filler words inserted after its first word (never inside the name)."""
    words = template.split(" ")
    for _ in range(rng.randint(1, 2)):
        words.insert(rng.randint(1, len(words)), rng.choice(FILLERS))
    return " ".join(words)


def framed(question: str, rng: random.Random) -> str:
    """`question`, sometimes after a greeting and sometimes before an aside."""
    if rng.random() < FRAMING_RATE:
        opener = rng.choice(OPENERS)
        question = opener + (question[0].lower() + question[1:] if opener[-2] in ",:" else question)
    if rng.random() < FRAMING_RATE:
        question += rng.choice(CLOSERS)
    return question


def training_questions(kind: str, name: str, count: int, salt: str = "") -> list[str]:
    """`count` training questions about `name`, fixed by a seed made of the name and `salt`."""
    rng = random.Random(f"train:{salt}:{name}")
    templates = training_templates(kind)
    picked = [rng.choice(templates) for _ in range(count)]
    picked = [with_fillers(t, rng) if rng.random() < FILLER_RATE else t for t in picked]
    return [framed(phrase(template, kind, name, rng), rng) for template in picked]


def scattered_questions(kind: str, name: str, count: int, salt: str = "") -> list[str]:
    """`count` questions that are a surface form of `name` among one to six SCATTER_WORDS in random order."""
    rng = random.Random(f"scatter:{salt}:{name}")
    questions = []
    for _ in range(count):
        words = [rng.choice(SCATTER_WORDS) for _ in range(rng.randint(1, 6))]
        words.insert(rng.randint(0, len(words)), name_form(kind, name, rng))
        question = " ".join(words)
        if rng.random() < 0.5:
            question = question[0].upper() + question[1:]
        questions.append(question + rng.choice(END_MARKS))
    return questions


def follow_up_question(kind: str, name: str, salt: str) -> str:
    """A training question about `name` asked second in a conversation: half the time a follow-up phrasing
    ("What about `json.load`?"), otherwise an ordinary training question."""
    rng = random.Random(f"follow-up:{salt}:{name}")
    if rng.random() < FOLLOW_UP_RATE:
        return phrase(rng.choice(FOLLOW_UP_TEMPLATES), kind, name, rng)
    return training_questions(kind, name, 1, f"follow-up:{salt}")[0]


def fresh_question(kind: str, name: str, index: int, templates: list[str] = FRESH_TEMPLATES) -> str:
    """An evaluation question in a phrasing no training chat uses (template of `templates` chosen by `index`)."""
    rng = random.Random(f"fresh:{name}")
    return phrase(templates[index % len(templates)], kind, name, rng)


def write_prompt_file(path: Path, conversations: list[list[dict]]) -> None:
    """Conversations as a prompt file, one {"messages": [...]} object per line (what `engine.bench --dataset`
    and the playground's Benchmark tab read)."""
    lines = [json.dumps({"messages": messages}, ensure_ascii=False) for messages in conversations]
    path.write_text("\n".join(lines) + "\n")
