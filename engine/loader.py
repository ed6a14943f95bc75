"""Resolving a model (curated name, local folder or hub id) and loading what the engine needs from it.

`transformers` is the loader of configs and tokenizers; the weights go straight from safetensors
into the native model (fusing Q/K/V and gate/up on the way). Remote code is never trusted.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import MODELS_FILE, PRESETS_DIR
from engine.errors import ModelLoadError

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


def resolve_model_path(model: str) -> Path:
    """A local folder holding config.json for `model`: a curated name, a folder, or a hub id to download."""
    entry = list_models().get(model)
    source = entry.source if entry else model
    local = Path(source) if Path(source).is_absolute() else PROJECT_ROOT / source
    for candidate in (local, Path(source)):
        if candidate.is_dir():
            if not (candidate / "config.json").is_file():
                raise ModelLoadError(f"{candidate} has no config.json: not a Hugging Face model folder")
            return candidate
    if entry is not None and not _HUB_ID.match(source):
        raise ModelLoadError(f"curated model {model!r} points to {source}, which is missing "
                             "(the bundled demo pair is rebuilt by `make demo-model`)")
    if not _HUB_ID.match(source):
        raise ModelLoadError(f"unknown model {model!r}: not a curated name ({', '.join(list_models())}), "
                             "not a local folder and not a hub id of the form 'org/name'")
    return _download(source)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except Exception as error:  # network, auth (gated repos) and not-found errors all end here
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
        add(json.loads(generation_config.read_text()).get("eos_token_id"))
    add(getattr(hf_config, "eos_token_id", None))
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
    return frozenset(ids)


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no safetensors weights in {path} (only safetensors checkpoints are loaded)")
    return files


def _native_name(name: str) -> tuple[str, str | None]:
    """Map an HF weight name to (native parameter name, fused part or None)."""
    name = name.removeprefix("model.")
    for part in ("q", "k", "v"):
        if f".self_attn.{part}_proj." in name:
            return name.replace(f".self_attn.{part}_proj.", ".qkv_proj."), part
    for part in ("gate", "up"):
        if f".mlp.{part}_proj." in name:
            return name.replace(f".mlp.{part}_proj.", ".gate_up_proj."), part
    name = name.replace(".self_attn.o_proj.", ".o_proj.").replace(".mlp.down_proj.", ".down_proj.")
    return name.replace(".self_attn.q_norm.", ".q_norm.").replace(".self_attn.k_norm.", ".k_norm."), None


def load_native_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy a safetensors checkpoint into the native model, fusing Q/K/V and gate/up."""
    spec = model.spec
    q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    offsets = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size),
               "gate": (0, spec.intermediate_size), "up": (spec.intermediate_size, spec.intermediate_size)}
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as checkpoint:
            for hf_name in checkpoint.keys():
                name, part = _native_name(hf_name)
                if name not in params:
                    if "rotary_emb" in name:
                        continue
                    raise ModelLoadError(f"unexpected weight {hf_name!r} in {file.name}")
                tensor = checkpoint.get_tensor(hf_name)
                target = params[name].data
                if part is not None:
                    start, length = offsets[part]
                    target = target.narrow(0, start, length)
                if target.shape != tensor.shape:
                    raise ModelLoadError(f"weight {hf_name!r} has shape {tuple(tensor.shape)}, "
                                         f"expected {tuple(target.shape)}")
                target.copy_(tensor)
                loaded.add(name if part is None else f"{name}:{part}")
    expected = set()
    for name, _ in model.named_parameters():
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            expected.update(f"{name}:{part}" for part in "qkv")
        elif name.endswith("gate_up_proj.weight"):
            expected.update(f"{name}:{part}" for part in ("gate", "up"))
        else:
            expected.add(name)
    if spec.tie_word_embeddings:
        expected.discard("lm_head.weight")
        loaded.discard("lm_head.weight")
    missing = sorted(expected - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint in {path} lacks {len(missing)} weight(s), e.g. {missing[:3]}")
