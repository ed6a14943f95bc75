"""The training text: stdlib documentation topics and docstrings, as plain text and chat.

Docstrings are read from the standard library's source files with ``ast``, so the long
tail of modules is never imported. Only the curated popular names (`popular.py`), many of
them implemented in C and so absent from the sources, are looked up on the imported
standard-library module. Entries are split into train and held-out parts by hashing the
module or topic section they belong to, so a held-out module contributes nothing (not even
one method) to training; popular entries always train, since recalling them is the point.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import inspect
import pydoc_data.topics
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from engine.training.popular import popular_names, popular_share, popular_topics
from engine.training.questions import (
    EVERYDAY_TEMPLATES,
    FRESH_FOLLOW_UPS,
    FRESH_TEMPLATES,
    follow_up_question,
    fresh_question,
    scattered_questions,
    training_questions,
)

SKIPPED_PACKAGES = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "ensurepip",
    "turtledemo", "__pycache__", "config-3", "pydoc_data", "encodings", "venv",
}
# After the first paragraph, one that opens like this is code, which ends an answer.
CODE_OPENINGS = ("#", "class ", "def ", "@", "import ", "from ")
MAX_ANSWER_CHARS = 280
MIN_ANSWER_CHARS = 40
POPULAR_MIN_CHARS = 16
# A leading `name(args)` line of a C docstring, optionally followed by `-> what it does`.
SIGNATURE_LINE = re.compile(r"[\w.]+\(.*\)\s*(?:(?:-+>|\s-)\s*(?P<rest>.*))?")


@dataclass(frozen=True)
class DocEntry:
    """One documented thing: what it is, its name, the text, and its split key."""

    kind: str
    name: str
    text: str
    group: str


@dataclass(frozen=True)
class Corpus:
    """Plain documents and chat conversations, separately for train and held-out.

    `popular` lists the trained entries that got `popular_copies` more chats each, in
    `popular_chats` (kept apart from `train_chats` so the tokenizer sees them once) with the
    two-question conversations of `follow_up_chats`, and
    `scattered_copies` chats each asked as scattered questions, in `scattered_chats` (only
    the target's recall pass trains on those).
    """

    train_text: list[str]
    train_chats: list[list[dict]]
    popular_chats: list[list[dict]]
    scattered_chats: list[list[dict]]
    heldout_text: list[str]
    heldout_chats: list[list[dict]]
    train_entries: list[DocEntry]
    heldout_entries: list[DocEntry]
    popular: list[DocEntry]


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
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]


def summary(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """The answer to a question: leading prose paragraphs, stopping before code and at `limit`.

    Indented paragraphs (parameter lists, code) and grammar rules are skipped; after the first
    paragraph, one that introduces code or a list (ends with ":") ends the answer. Short
    answers that end cleanly teach a tiny model to stop instead of rambling.
    """
    kept: list[str] = []
    for para in paragraphs(text):
        if para[0].isspace() or "::=" in para:
            continue
        if para.startswith((">>>", "...")) or (kept and (para.startswith(CODE_OPENINGS) or para.endswith(":"))):
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


def without_signature(text: str) -> str:
    """Drops the `name(args) -> result` lines (and a parenthesised note) that open many C docstrings.

    What follows the arrow is kept, capitalised, when it is a description: alone on the
    line in `zip(*iterables) --> Yield tuples ...`, or continued by the next line.
    """
    lines = text.lstrip("\n").splitlines()
    while lines and (match := SIGNATURE_LINE.fullmatch(lines[0].strip())):
        rest = match.group("rest") or ""
        continued = len(lines) > 1 and lines[1].strip() != "" and not SIGNATURE_LINE.fullmatch(lines[1].strip())
        if rest[:1].isupper() or (rest and continued):
            lines[0] = rest[0].upper() + rest[1:]
            break
        lines.pop(0)
    if lines and lines[0].startswith("(") and lines[0].rstrip().endswith(")"):
        lines.pop(0)
    return "\n".join(lines).strip()


def topic_entries() -> list[DocEntry]:
    """Splits each pydoc topic into its titled sections (one entry per section, split by title)."""
    entries = []
    for _, raw in sorted(pydoc_data.topics.topics.items()):
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
                entries.append(DocEntry("topic", title, body, "topic:" + title))
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
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        if name is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        entries.extend(docstring_entries(tree, name, "module:" + name.split(".")[0]))
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


def lookup(name: str) -> tuple[object, object, str]:
    """(the object, its owner, its top-level module) for a dotted name as people write it.

    `len` and `str.split` are builtins; otherwise the longest importable prefix is the module.
    """
    parts = name.split(".")
    if hasattr(builtins, parts[0]):
        owner, rest, top = builtins, parts, "builtins"
    else:
        for cut in range(len(parts), 0, -1):
            try:
                owner, rest, top = importlib.import_module(".".join(parts[:cut])), parts[cut:], parts[0]
                break
            except ImportError:
                continue
        else:
            raise LookupError(name)
    obj = owner
    for part in rest:
        owner, obj = obj, getattr(obj, part)
    return obj, owner, top


def popular_entry(name: str) -> DocEntry | None:
    """The entry for one popular name, from the interpreter's own docstring (None if it has none)."""
    try:
        obj, owner, top = lookup(name)
    except (LookupError, AttributeError):
        return None
    doc = obj.__dict__.get("__doc__") if inspect.ismodule(obj) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    if inspect.ismodule(obj):
        kind = "module"
    elif isinstance(obj, type):
        kind = "class"
    elif isinstance(owner, type):
        kind = "method"
    else:
        kind = "function"
    return DocEntry(kind, name, clean(without_signature(inspect.cleandoc(doc))), "module:" + top)


def popular_entries() -> list[DocEntry]:
    """Every resolvable curated popular name, in the curated order."""
    return [entry for name in popular_names() if (entry := popular_entry(name))]


def dedupe(entries: list[DocEntry], min_chars: int) -> list[DocEntry]:
    """Drops repeated and near-empty docstrings (copies inflate loops in a small model)."""
    seen: set[str] = set()
    unique = []
    for entry in entries:
        key = re.sub(r"\W+", " ", entry.text.lower()).strip()
        if len(entry.text) < min_chars or key in seen:
            continue
        seen.add(key)
        unique.append(entry)
    return unique


def as_document(entry: DocEntry) -> str:
    header = entry.name if entry.kind == "topic" else f"{entry.kind} {entry.name}"
    return f"{header}\n\n{entry.text}"


def answer_for(entry: DocEntry, min_chars: int = MIN_ANSWER_CHARS) -> str:
    """The assistant's reply: the leading prose of the documentation, from its first sentence.

    Empty when that is shorter than `min_chars` (a popular entry may be short and complete:
    "Append object to the end of the list.").
    """
    text = entry.text
    first, _, rest = text.partition("\n\n")
    if first.strip() in (entry.name, entry.name.rpartition(".")[2]):
        text = rest
    answer = summary(text)
    return answer if len(answer) >= min_chars else ""


def as_chats(
    entry: DocEntry, count: int, salt: str = "", min_chars: int = MIN_ANSWER_CHARS, asked=training_questions,
) -> list[list[dict]]:
    """`count` differently phrased questions about `entry` (from `asked`), each answered by `answer_for`."""
    answer = answer_for(entry, min_chars)
    if not answer:
        return []
    return [
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        for question in asked(entry.kind, entry.name, count, salt)
    ]


def module_of(entry: DocEntry) -> str:
    """The module a popular entry belongs to as people write it (`glob` for `glob.glob`, `builtins` for `len`)."""
    return entry.group.removeprefix("module:").removeprefix("topic:")


def follow_up_chats(popular: list[DocEntry], copies: int, seed: int = 0) -> list[list[dict]]:
    """`copies` two-question conversations opening with each popular entry, so that a second question is
    answered about its own entry instead of the first one's.

    Half of the second entries come from the first one's module, which teaches `glob` and `glob.glob` apart:
    after a module one of its names; after a name, a third of the time its module (`urllib.parse` after
    `urllib.parse.urlparse`, the turn a model most easily answers with the previous entry), otherwise a sibling
    (`queue.PriorityQueue` after `queue.Queue`). The rest are any popular entry.
    """
    rng = random.Random(f"follow-ups:{seed}")
    by_module: dict[str, list[DocEntry]] = {}
    for entry in popular:
        by_module.setdefault(module_of(entry), []).append(entry)
    chats = []
    for first in popular:
        module = module_of(first)
        module_entry = next((e for e in by_module[module] if e.name == module and e is not first), None)
        siblings = [e for e in by_module[module] if e is not first and e is not module_entry]
        first_answer = answer_for(first, POPULAR_MIN_CHARS)
        for copy in range(copies):
            if rng.random() >= 0.5 or not (siblings or module_entry):
                second = rng.choice(popular)
            elif module_entry and (not siblings or rng.random() < 1 / 3):
                second = module_entry
            else:
                second = rng.choice(siblings)
            if second is first:
                continue
            question = training_questions(first.kind, first.name, 1, f"first:{copy}")[0]
            follow_up = follow_up_question(second.kind, second.name, f"{first.name}:{copy}")
            chats.append([
                {"role": "user", "content": question},
                {"role": "assistant", "content": first_answer},
                {"role": "user", "content": follow_up},
                {"role": "assistant", "content": answer_for(second, POPULAR_MIN_CHARS)},
            ])
    return chats


def build_corpus(
    limit: int | None = None, phrasings: int = 2, popular_copies: int = 16, popular_limit: int | None = None,
    scattered_copies: int = 0, follow_up_copies: int = 0,
) -> Corpus:
    """Collects, dedupes and splits everything; `limit` caps each source's entries (for tests).

    Every entry is a document and `phrasings` chats; a popular entry gets `popular_copies`
    more chats, each phrased anew, so the model never sees one question often enough to
    key its answer on the wording instead of the name, `follow_up_copies` two-question
    conversations opening with it, and `scattered_copies` chats asked as scattered questions.
    `popular_limit` keeps about that many popular entries (the everyday surface and the
    leading share of every curated group); the rest train as ordinary entries.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    topics = topic_entries()
    curated = popular_entries()[:limit]
    share = popular_share(popular_limit)
    wanted = set(popular_names(share)) | set(popular_topics(share))
    candidates = [entry for entry in curated + topics if entry.name in wanted]
    popular = [e for e in dedupe(candidates, POPULAR_MIN_CHARS) if answer_for(e, POPULAR_MIN_CHARS)]
    names = {entry.name for entry in popular}
    others = dedupe(popular + curated + topics[:limit] + source_entries(root, limit), MIN_ANSWER_CHARS)
    entries = popular + [entry for entry in others if entry.name not in names]
    popular_groups = {entry.group for entry in popular}
    held_out = {e.name: is_held_out(e.group) and e.group not in popular_groups for e in entries}
    parts: dict[bool, tuple[list[str], list[list[dict]]]] = {False: ([], []), True: ([], [])}
    for entry in entries:
        texts, chats = parts[held_out[entry.name]]
        texts.append(as_document(entry))
        chats.extend(as_chats(entry, phrasings))
    popular_chats = [chat for e in popular for chat in as_chats(e, popular_copies, "popular", POPULAR_MIN_CHARS)]
    popular_chats += follow_up_chats(popular, follow_up_copies)
    scattered_chats = [chat for e in popular
                       for chat in as_chats(e, scattered_copies, "", POPULAR_MIN_CHARS, scattered_questions)]
    return Corpus(
        train_text=parts[False][0], train_chats=parts[False][1], popular_chats=popular_chats,
        scattered_chats=scattered_chats,
        heldout_text=parts[True][0], heldout_chats=parts[True][1],
        train_entries=[e for e in entries if not held_out[e.name]],
        heldout_entries=[e for e in entries if held_out[e.name]],
        popular=popular,
    )


def recall_cases(
    entries: list[DocEntry], count: int, min_chars: int = MIN_ANSWER_CHARS, templates: list[str] = FRESH_TEMPLATES,
    offset: int = 0,
) -> list[tuple[str, str]]:
    """(fresh question, reference answer) for `count` entries spread evenly over `entries`, from the
    `offset`-th one of each stride (another offset asks other entries).

    Every question uses a phrasing of `templates`, which no training chat uses.
    """
    usable = [entry for entry in entries if answer_for(entry, min_chars)]
    picked = evenly_spread(usable[offset:], count)
    return [(fresh_question(e.kind, e.name, i, templates), answer_for(e, min_chars)) for i, e in enumerate(picked)]


def everyday_cases(popular: list[DocEntry], count: int) -> list[tuple[str, str]]:
    """The answer check's second set: other popular entries than `recall_cases` asks, in EVERYDAY_TEMPLATES."""
    stride = max(1, len(popular) // max(1, count))
    return recall_cases(popular, count, POPULAR_MIN_CHARS, EVERYDAY_TEMPLATES, offset=stride // 2)


def follow_up_cases(popular: list[DocEntry], count: int) -> list[tuple[str, str, str, str]]:
    """(first question, its reference, follow-up question, its reference) for `count` pairs of popular entries:
    the first in a FRESH_TEMPLATES phrasing, the second in a FRESH_FOLLOW_UPS one, every other pair from one
    module (`glob` then `glob.glob`), the rest far apart in the list."""
    usable = [entry for entry in popular if answer_for(entry, POPULAR_MIN_CHARS)]
    firsts = evenly_spread(usable, count)
    cases = []
    for index, first in enumerate(firsts):
        same_module = [e for e in usable if module_of(e) == module_of(first) and e is not first]
        if index % 2 == 0 and same_module:
            second = same_module[index % len(same_module)]
        else:
            second = usable[(usable.index(first) + len(usable) // 2) % len(usable)]
        cases.append((
            fresh_question(first.kind, first.name, index), answer_for(first, POPULAR_MIN_CHARS),
            fresh_question(second.kind, second.name, index, FRESH_FOLLOW_UPS), answer_for(second, POPULAR_MIN_CHARS),
        ))
    return cases


def evenly_spread(entries: list[DocEntry], count: int) -> list[DocEntry]:
    """At most `count` of `entries`, taken at an even stride from the first, so every part of the list is asked."""
    step = max(1, len(entries) // max(1, count))
    return entries[::step][:count]
