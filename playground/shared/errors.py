"""Turning any failure into one line a visitor may read.

Why: engine errors are written for the person running the server and may name files of this
machine (a model folder, the Hugging Face cache). In public mode those paths are reduced to their
last component, so a probe learns nothing about the server's file system.
"""

from __future__ import annotations

import re

from engine import EngineError

# An absolute POSIX path that is not part of a URL ("https://host/x") or a relative hub id ("org/name").
_PATH_CHARS = r"[^\s'\"`:,;()\[\]{}<>/]"
_ABSOLUTE_PATH = re.compile(rf"(?<![\w.:/~-])~?/(?:{_PATH_CHARS}+/)*({_PATH_CHARS}+)")


class Refused(ValueError):
    """What the playground refuses before the engine sees it: bad input, a hosting cap, the memory budget.

    `field` names the input at fault when there is one (the OpenAI routes answer it as the error's `param`).
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def redact_paths(text: str) -> str:
    """Every absolute path in `text` replaced by its last component (`/srv/models/x/config.json` -> `config.json`)."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1), text)


def describe_error(error: BaseException, public: bool) -> str:
    """One readable line for `error`: its message for errors a user can cause, else its type too."""
    if isinstance(error, EngineError | Refused):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    return redact_paths(text) if public else text
