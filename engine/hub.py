"""Resolving a model (curated name, local folder or hub id) and reading its config and tokenizer.

`transformers` is the loader of configs and tokenizers (the weights are read by
`engine/model/weights.py` or by the transformers backend, from safetensors only). Remote code is
never trusted.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError, ModelLoadError
from engine.presets import MODELS_FILE, PRESETS_DIR

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


@dataclass(frozen=True)
class ModelEntry:
    """One curated model from presets/models.toml."""

    name: str
    source: str
    draft: str | None = None
    label: str = ""
    params: str = ""
    memory: str = ""
    default: bool = False
    examples: tuple[str, ...] = ()  # questions this model answers well, offered as clickable examples
    chat_prompts: str = ""  # a .jsonl of questions suited to this model, asked by benchmarks' `chat` dataset


def list_models() -> dict[str, ModelEntry]:
    """The curated models, by name, in file order."""
    path = PRESETS_DIR / MODELS_FILE
    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        table = tomllib.load(handle).get("models", {})
    fields = set(ModelEntry.__dataclass_fields__) - {"name"}
    for name, entry in table.items():
        if not isinstance(entry.get("source"), str):
            raise ModelLoadError(f"{path}: entry {name!r} has no source (quote table names containing dots)")
    return {name: ModelEntry(name=name, **{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in entry.items() if k in fields})
            for name, entry in table.items()}


def curated_draft(model: str, draft_model: str | None = None) -> str:
    """The draft `draft_model` names, else the one presets/models.toml pairs with `model` (named by its curated
    name or by its source); one clear error when there is neither."""
    if draft_model:
        return draft_model
    models = list_models()
    entry = models.get(model) or next((e for e in models.values() if e.source == model), None)
    if entry is None or not entry.draft:
        raise ConfigError(f"speculative='draft' needs draft_model: {model!r} has no curated draft in "
                          "presets/models.toml; name a smaller model with the same tokenizer")
    return entry.draft


def hub_repo(model: str) -> str | None:
    """The hub repository `model` (a curated name, a local folder or a hub id) is fetched from; None when its files
    are local (a bundled model or a folder)."""
    entry = list_models().get(model)
    source = entry.source if entry else model
    if not isinstance(source, str) or _local_folder(source) is not None or not _HUB_ID.match(source):
        return None
    return source


def _local_folder(source: str) -> Path | None:
    local = Path(source) if Path(source).is_absolute() else PROJECT_ROOT / source
    return next((candidate for candidate in (local, Path(source)) if candidate.is_dir()), None)


def resolve_model_path(model: str, download: bool = True) -> Path:
    """A local folder holding config.json for `model`: a curated name, a folder, or a hub id, downloaded unless
    `download` is off (then a hub model must already be in the local cache, or ModelLoadError says so)."""
    entry = list_models().get(model)
    source = entry.source if entry else model
    folder = _local_folder(source)
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"{folder} has no config.json: not a Hugging Face model folder")
        return folder
    if entry is not None and not _HUB_ID.match(source):
        raise ModelLoadError(f"curated model {model!r} points to {source}, which is missing "
                             "(the bundled demo pair is rebuilt by `make demo-model`)")
    if not _HUB_ID.match(source):
        raise ModelLoadError(f"unknown model {model!r}: not a curated name ({', '.join(list_models())}), "
                             "not a local folder and not a hub id of the form 'org/name'")
    return _download(source, local_only=not download)


def _download(repo_id: str, local_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES, local_files_only=local_only))
    except Exception as error:  # network, auth (gated repos), not-found and not-in-cache errors all end here
        if local_only:
            raise ModelLoadError(f"{repo_id!r} is not in the local cache yet (loading it downloads it first)") \
                from error
        raise ModelLoadError(f"could not fetch {repo_id!r} from the Hugging Face Hub: "
                             f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error


def load_hf_config(path: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as error:
        raise ModelLoadError(f"cannot read the model config in {path}: {error}") from error


def load_tokenizer(path: Path):
    """The model's tokenizer, or None when the folder has none (then only token-id prompts work)."""
    from transformers import AutoTokenizer

    has_files = any((path / name).exists() for name in
                    ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json"))
    if not has_files:
        return None
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as error:
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {error}") from error


def eos_token_ids(path: Path, hf_config, tokenizer) -> frozenset[int]:
    """Every id that ends a turn: generation_config.json's, the config's and the tokenizer's."""
    ids: set[int] = set()

    def add(value):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))

    generation_config = path / "generation_config.json"
    if generation_config.is_file():
        try:
            add(json.loads(generation_config.read_text()).get("eos_token_id"))
        except (ValueError, AttributeError) as error:
            raise ModelLoadError(f"generation_config.json in {path.name} is not a JSON object: {error}") from error
    add(getattr(hf_config, "eos_token_id", None))
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
    return frozenset(ids)
