"""The training text: stdlib documentation topics and docstrings, as plain text and chat.

Docstrings are read from the standard library's source files with ``ast`` so that no
arbitrary module is ever imported. Entries are split into train and held-out parts by
hashing the name of the top-level module or topic they belong to, so a held-out module
contributes nothing (not even one method) to training.
"""

from __future__ import annotations

import ast
import hashlib
import pydoc_data.topics
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIPPED_PACKAGES = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "ensurepip",
    "turtledemo", "__pycache__", "config-3", "pydoc_data", "encodings", "venv",
}
MAX_ANSWER_CHARS = 280
MIN_ANSWER_CHARS = 40

QUESTION_TEMPLATES = {
    "module": [
        "What is the `{name}` module for?",
        "What does the `{name}` module do?",
        "Tell me about the `{name}` module.",
        "Explain the `{name}` module.",
    ],
    "class": [
        "What is the `{name}` class?",
        "What does the `{name}` class do?",
        "Explain the `{name}` class.",
        "Tell me about `{name}`.",
    ],
    "function": [
        "What does the `{name}` function do?",
        "Explain the `{name}` function.",
        "How do I use `{name}`?",
        "What is `{name}` for?",
    ],
    "method": [
        "What does the `{name}` method do?",
        "Explain the `{name}` method.",
        "What is `{name}` for?",
        "How does `{name}` work?",
    ],
    "topic": [
        "Explain {name}.",
        "What is {name}?",
        "Tell me about {name}.",
        "How does {name} work in Python?",
    ],
}


@dataclass(frozen=True)
class DocEntry:
    """One documented thing: what it is, its name, the text, and its split key."""

    kind: str
    name: str
    text: str
    group: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.group)


@dataclass(frozen=True)
class Corpus:
    """Plain documents and chat conversations, separately for train and held-out."""

    train_text: list[str]
    train_chats: list[list[dict]]
    heldout_text: list[str]
    heldout_chats: list[list[dict]]
    train_entries: list[DocEntry]
    heldout_entries: list[DocEntry]


def is_held_out(group: str, percent: int = 5) -> bool:
    """Deterministic split: the same group lands on the same side on every machine."""
    digest = hashlib.sha256(group.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def clean(text: str) -> str:
    """Normalises reST markup and whitespace so the model sees one style of prose."""
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    text = re.sub(r":[a-z]+:`([^`]+)`", r"`\1`", text)
    text = text.replace("\t", "    ")
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def summary(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """The answer to a question: leading prose paragraphs, stopping before code and at `limit`.

    Short answers that end cleanly teach a tiny model to stop instead of rambling.
    """
    kept: list[str] = []
    for para in paragraphs(text):
        if para.startswith((">>>", "...")) or (para.endswith("::") and kept) or "::=" in para:
            break
        joined = re.sub(r"\s+", " ", para)
        if kept and len("\n\n".join(kept)) + len(joined) > limit:
            break
        if not kept and len(joined) > limit:
            sentences = re.split(r"(?<=[.!?])\s+", joined)
            joined = sentences[0]
            for sentence in sentences[1:]:
                if len(joined) + len(sentence) + 1 > limit:
                    break
                joined += " " + sentence
            kept.append(joined[: limit * 2])
            break
        kept.append(joined)
    answer = "\n\n".join(kept)
    return answer[:-1] + "." if answer.endswith(":") else answer


def topic_entries() -> list[DocEntry]:
    """Splits each pydoc topic into its titled sections (one entry per section)."""
    entries = []
    for key, raw in sorted(pydoc_data.topics.topics.items()):
        lines = raw.splitlines()
        heads = [
            i for i in range(len(lines) - 1)
            if lines[i].strip() and re.fullmatch(r"([*=\-~^])\1{2,}", lines[i + 1].strip())
        ]
        for n, start in enumerate(heads):
            end = heads[n + 1] if n + 1 < len(heads) else len(lines)
            body = clean("\n".join(lines[start + 2: end]))
            title = re.sub(r'"([^"]+)"', r"`\1`", lines[start].strip())
            title = re.sub(r"^\d+(\.\d+)*\.?\s+", "", title)
            title = re.sub(r"(?<![`\w])([A-Z][a-z]+)", lambda m: m.group(1).lower(), title)
            if len(body) >= MIN_ANSWER_CHARS:
                entries.append(DocEntry("topic", title, body, "topic:" + key))
    return entries


def module_name(path: Path, root: Path) -> str | None:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or any(p in SKIPPED_PACKAGES or p.startswith("_") for p in parts):
        return None
    return ".".join(parts)


def source_entries(root: Path, limit: int | None = None) -> list[DocEntry]:
    """Docstrings of public modules, classes, functions and methods, parsed with `ast`."""
    entries = []
    files = sorted(root.rglob("*.py"))
    for path in files:
        name = module_name(path, root)
        if name is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        group = "module:" + name.split(".")[0]
        entries.extend(docstring_entries(tree, name, group))
        if limit is not None and len(entries) >= limit:
            break
    return entries


def docstring_entries(tree: ast.Module, module: str, group: str) -> list[DocEntry]:
    found = []
    doc = ast.get_docstring(tree)
    if doc:
        found.append(DocEntry("module", module, clean(doc), group))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            qualname = f"{module}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                found.append(DocEntry("class", qualname, clean(doc), group))
            for item in node.body:
                if (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not item.name.startswith("_")
                    and (doc := ast.get_docstring(item))
                ):
                    found.append(DocEntry("method", f"{qualname}.{item.name}", clean(doc), group))
        elif (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("_")
            and (doc := ast.get_docstring(node))
        ):
            found.append(DocEntry("function", f"{module}.{node.name}", clean(doc), group))
    return found


def dedupe(entries: list[DocEntry]) -> list[DocEntry]:
    """Drops repeated and near-empty docstrings (copies inflate loops in a small model)."""
    seen: set[str] = set()
    unique = []
    for entry in entries:
        key = re.sub(r"\W+", " ", entry.text.lower()).strip()
        if len(entry.text) < MIN_ANSWER_CHARS or key in seen:
            continue
        seen.add(key)
        unique.append(entry)
    return unique


def as_document(entry: DocEntry) -> str:
    header = entry.name if entry.kind == "topic" else f"{entry.kind} {entry.name}"
    return f"{header}\n\n{entry.text}"


def opening_sentence(entry: DocEntry) -> str:
    """A first sentence that repeats the name exactly as the question wrote it.

    The name keeps its backticks and leading space, so it is the same token sequence as in
    the question: copying it is something even a tiny model learns reliably, and every
    answer then starts on topic, even about a module the model has never seen.
    """
    owner = entry.name.rpartition(".")[0]
    if entry.kind == "module":
        return f"The `{entry.name}` module is part of the Python standard library."
    if entry.kind == "class":
        return f"The `{entry.name}` class is defined in the `{owner}` module."
    if entry.kind == "function":
        return f"The `{entry.name}` function is defined in the `{owner}` module."
    if entry.kind == "method":
        return f"The `{entry.name}` method belongs to the `{owner}` class."
    return f"This part of the Python reference is about {entry.name}."


def answer_for(entry: DocEntry) -> str:
    """The assistant's reply: the opening sentence, then the leading documentation."""
    text = entry.text
    first, _, rest = text.partition("\n\n")
    if first.strip() in (entry.name, entry.name.rpartition(".")[2]):
        text = rest
    answer = summary(text)
    if len(answer) < MIN_ANSWER_CHARS:
        return ""
    return f"{opening_sentence(entry)}\n\n{answer}"


def as_chats(entry: DocEntry, phrasings: int) -> list[list[dict]]:
    """`phrasings` differently worded questions about `entry`, each answered by `answer_for`."""
    answer = answer_for(entry)
    if not answer:
        return []
    templates = QUESTION_TEMPLATES[entry.kind]
    start = int(hashlib.sha256(entry.name.encode()).hexdigest(), 16) % len(templates)
    questions = [
        templates[(start + i) % len(templates)].format(name=entry.name)
        for i in range(min(phrasings, len(templates)))
    ]
    return [
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        for question in questions
    ]


@dataclass(frozen=True)
class NameParts:
    """Words that real names are made of, to invent names that look like them, and the names to avoid."""

    identifier_words: list[str]
    title_words: list[str]
    real_names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: list[DocEntry], real_names: set[str]) -> NameParts:
        """Words from `entries` (the training side only, so no held-out name leaks into a chat)."""
        identifier, title = set(), set()
        for entry in entries:
            if entry.kind == "topic":
                title.update(w for w in entry.name.split() if w.isalpha() and w.islower() and len(w) >= 4)
            else:
                last = entry.name.rpartition(".")[2]
                split = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", last).lower().split("_")
                identifier.update(w for w in split if w.isalpha() and len(w) >= 3)
        return cls(sorted(identifier), sorted(title), frozenset(real_names))


def invented_name(entry: DocEntry, parts: NameParts) -> str:
    """A made-up name of the same kind and shape as `entry.name`, fixed by a hash of it.

    It is built from the words real names are made of (`copy` + `reg`), so it splits into
    the same kind of tokens as the real names a held-out question asks about. Never one of
    the real names, so no chat contradicts a real entry's documentation.
    """
    rng = random.Random(hashlib.sha256(entry.name.encode()).digest())

    def words(count: int) -> list[str]:
        return rng.sample(parts.identifier_words, count)

    def candidate() -> str:
        if entry.kind == "topic":
            return " ".join(rng.sample(parts.title_words, rng.randint(1, 3)))
        module = "".join(words(rng.randint(1, 2)))
        if entry.kind == "module":
            return module
        class_name = "".join(w.capitalize() for w in words(rng.randint(1, 2)))
        if entry.kind == "class":
            return f"{module}.{class_name}"
        function = "_".join(words(rng.randint(1, 2)))
        if entry.kind == "method":
            return f"{module}.{class_name}.{function}"
        return f"{module}.{function}"

    name = candidate()
    while name in parts.real_names:
        name = candidate()
    return name


def renamed(entry: DocEntry, parts: NameParts) -> DocEntry:
    """`entry` under an invented name, with the name's mentions in its text renamed too.

    A chat about a thing the model has never seen can only be started by copying the name
    from the question. Training on such chats teaches the copy that held-out questions
    need, where memorising the real names would not.
    """
    new_name = invented_name(entry, parts)
    text = re.sub(rf"(?<![\w.]){re.escape(entry.name)}(?![\w])", new_name, entry.text)
    if entry.kind != "topic":
        old_short, new_short = entry.name.rpartition(".")[2], new_name.rpartition(".")[2]
        text = re.sub(rf"`{re.escape(old_short)}(?=[`(])", f"`{new_short}", text)
    return DocEntry(entry.kind, new_name, text, entry.group)


def build_corpus(limit: int | None = None, phrasings: int = 2) -> Corpus:
    """Collects, dedupes and splits everything; `limit` caps each source's entries (for tests).

    Every training entry also gets one chat under an invented name (see `renamed`); the
    held-out side keeps only real names, since it measures the real task.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    entries = dedupe(topic_entries()[:limit] + source_entries(root, limit))
    train = [entry for entry in entries if not entry.held_out]
    heldout = [entry for entry in entries if entry.held_out]
    name_parts = NameParts.of(train, real_names={entry.name for entry in entries})
    parts: dict[bool, tuple[list[str], list[list[dict]]]] = {False: ([], []), True: ([], [])}
    for entry in entries:
        texts, chats = parts[entry.held_out]
        texts.append(as_document(entry))
        chats.extend(as_chats(entry, phrasings))
        if not entry.held_out:
            chats.extend(as_chats(renamed(entry, name_parts), 1))
    return Corpus(parts[False][0], parts[False][1], parts[True][0], parts[True][1], train, heldout)
