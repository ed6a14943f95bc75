"""Where a checkpoint's GGUF files live, keyed by the checkpoint, and making the ones that are missing.

Why cached: converting and quantizing take seconds for the demo model and minutes for a 1.7B one, and every load of a
llama.cpp level needs its file; a changed checkpoint must not be served from the old one's file. So each file's name
starts with a key of the checkpoint (its small files' bytes, its safetensors files' names, sizes and modification
times, and this converter's version); a load with another key converts again and removes the stale files.

Where: a `gguf/` folder inside the model folder when that folder is writable and is not in the Hugging Face Hub's
cache (a bundled or local model: its files sit beside it and go when it goes); otherwise
`$XDG_CACHE_HOME/inference-playground/gguf/<hash of the folder's path>/` (`~/.cache` by default), so a read-only
model folder (a Space's, a shared disk) and hub snapshots are never written to.

f32 is this project's conversion (`convert.py`); f16, q8_0 and q4_0 are made from it by llama.cpp's own quantizer
(`llama_model_quantize`, through the llama-cpp-python binding), with its default choices per tensor (norms stay f32;
for q4_0 the tied embedding/output matrix may get a wider type, as llama.cpp decides).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path

from engine.errors import ModelLoadError
from engine.gguf import GGUF_TYPES
from engine.gguf.convert import convert_checkpoint
from engine.gguf.runtime import load_binding
from engine.gguf.vocab import read_vocab
from engine.hub import load_tokenizer
from engine.model.weights import safetensors_files

CONVERTER_VERSION = "1"
KEY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja")
LLAMA_FTYPES = {"f16": 1, "q8_0": 7, "q4_0": 2}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
FOLDER = "gguf"
_MAKING = threading.Lock()  # one conversion at a time in this process (two engines loading the same model)


def checkpoint_key(path: Path) -> str:
    """16 hex digits that change when the checkpoint in `path` (or this converter) changes."""
    digest = hashlib.sha256(CONVERTER_VERSION.encode())
    for name in KEY_FILES:
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    for file in safetensors_files(path):
        stat = file.stat()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def gguf_folder(path: Path) -> Path:
    """The folder that holds the GGUF files of the checkpoint in `path` (see the module's docstring)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    resolved = path.resolve()
    if os.access(resolved, os.W_OK) and not resolved.is_relative_to(Path(HF_HUB_CACHE).resolve()):
        return resolved / FOLDER
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "inference-playground" / FOLDER / hashlib.sha256(str(resolved).encode()).hexdigest()[:16]


def gguf_path(path: Path, gguf_type: str, key: str | None = None) -> Path:
    """Where the `gguf_type` file of the checkpoint in `path` is (or will be, once `ensure_gguf` made it); `key` is
    the checkpoint's key when the caller has it."""
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type must be one of {GGUF_TYPES}, got {gguf_type!r}")
    return gguf_folder(path) / f"{path.name}-{key or checkpoint_key(path)}-{gguf_type}.gguf"


def ensure_gguf(path: Path, hf_config, gguf_type: str, threads: int) -> Path:
    """The `gguf_type` file of the checkpoint in `path`, converted (and quantized with `threads` threads) when it is
    not there yet; stale files of an earlier checkpoint in the same folder are removed."""
    key = checkpoint_key(path)
    target = gguf_path(path, gguf_type, key)
    with _MAKING:
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        source = gguf_path(path, "f32", key)
        if not source.is_file():
            vocab = read_vocab(path, hf_config.vocab_size, load_tokenizer(path))
            convert_checkpoint(path, hf_config, vocab, source)
        if gguf_type != "f32":
            quantize(source, target, gguf_type, threads)
        for stale in target.parent.glob("*.gguf"):
            if key not in stale.name:
                stale.unlink(missing_ok=True)
    return target


def quantize(source: Path, destination: Path, gguf_type: str, threads: int) -> None:
    """`source` (a float32 GGUF) as `gguf_type` by llama.cpp's quantizer, written through a temporary file."""
    llama_cpp = load_binding()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[gguf_type]
    params.nthread = threads
    partial = destination.with_name(f".{destination.name}.{os.getpid()}.partial")
    try:
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
        if status != 0:
            raise ModelLoadError(f"llama.cpp could not quantize {source.name} to {gguf_type} (status {status})")
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)
