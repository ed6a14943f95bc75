"""The checkpoint walker: read safetensors and hand each tensor to the loader of the layer it belongs to.

The model declares how checkpoint names map onto its fused layers (`packed_modules_mapping`);
each parameter carries its layer's `weight_loader` and the parts (`shard_ids`) it expects, so
the walker knows nothing of fusing, sharding or quantization. Only safetensors are read (no
pickles), and shard files named by an index must lie inside the model folder.

A checkpoint can also be held in CPU memory (`hold_checkpoint`), so that later loads read it from
there instead of its files: ZeroGPU mode loads the model on the CPU once, at start-up, and each GPU
call's forked worker inherits those tensors (copy-on-write) and only moves them to its device.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


class _HeldCheckpoint:
    """One checkpoint's tensors in CPU memory, by file, and how many holders keep it."""

    def __init__(self, files: dict[Path, dict[str, torch.Tensor]]):
        self.files = files
        self.holders = 1

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for tensors in self.files.values() for t in tensors.values())


_held: dict[Path, _HeldCheckpoint] = {}
_held_lock = threading.Lock()


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint's weight files: the shards its index names, or every *.safetensors file."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ModelLoadError(f"{INDEX_FILE} is not a valid safetensors index: {error}") from error
        root = path.resolve()
        files = []
        for shard in shards:
            file = (path / str(shard)).resolve()
            if not file.is_relative_to(root) or file.suffix != ".safetensors":
                raise ModelLoadError(f"{INDEX_FILE} names {shard!r}, which is not a safetensors file in the model "
                                     "folder")
            files.append(file)
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no safetensors weights in {path.name} (only safetensors checkpoints are loaded)")
    return files


def hold_checkpoint(path: Path) -> int:
    """Read every weight file of the checkpoint in `path` into CPU memory and keep it there until as many
    `release_checkpoint(path)` calls as holds; `load_weights` reads held files from memory. Returns its bytes."""
    key = Path(path).resolve()
    with _held_lock:
        held = _held.get(key)
        if held is not None:
            held.holders += 1
            return held.num_bytes
    files = {}
    for file in safetensors_files(key):
        with safe_open(str(file), framework="pt") as checkpoint:
            # Cloned: a tensor safetensors returns may map the file, which could change or go under it.
            files[file.resolve()] = {name: checkpoint.get_tensor(name).clone() for name in checkpoint.keys()}
    with _held_lock:
        held = _held.setdefault(key, _HeldCheckpoint(files))
        if held.files is not files:
            held.holders += 1
        return held.num_bytes


def release_checkpoint(path: Path) -> None:
    """Drop one hold of `path`'s checkpoint; the last one frees its memory."""
    key = Path(path).resolve()
    with _held_lock:
        held = _held.get(key)
        if held is not None:
            held.holders -= 1
            if held.holders == 0:
                del _held[key]


def _held_tensors(file: Path) -> dict[str, torch.Tensor] | None:
    resolved = file.resolve()
    with _held_lock:
        for held in _held.values():
            tensors = held.files.get(resolved)
            if tensors is not None:
                return tensors
    return None


class _HeldFile:
    """A held file with the two calls load_weights makes of a safetensors handle."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self._tensors = tensors

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


@contextmanager
def _open_weights(file: Path) -> Iterator:
    """The file's tensors: from memory where its checkpoint is held, else from the file."""
    tensors = _held_tensors(file)
    if tensors is not None:
        yield _HeldFile(tensors)
        return
    with safe_open(str(file), framework="pt") as checkpoint:
        yield checkpoint


def checkpoint_target(model: torch.nn.Module, name: str) -> tuple[str, object]:
    """(parameter name in `model`, part id or None) for a checkpoint tensor name."""
    for checkpoint_part, (fused, shard_id) in model.packed_modules_mapping.items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{fused}."), shard_id
    return name, None


def load_weights(model: torch.nn.Module, path: Path, rename: Callable[[str], str | None] | None = None) -> None:
    """Fill every parameter of `model` from the checkpoint in `path`, then let layers finish their weights.

    `rename` maps a checkpoint name to the name in `model`, or to None for a tensor this model does not hold (a
    pipeline stage holds some of the layers, renumbered from 0): such tensors are never read."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[tuple[str, object]] = set()
    for file in safetensors_files(path):
        with _open_weights(file) as checkpoint:
            for checkpoint_name in checkpoint.keys():
                if any(part in checkpoint_name for part in model.ignored_checkpoint_tensors):
                    continue
                target_name = rename(checkpoint_name) if rename else checkpoint_name
                if target_name is None:
                    continue
                name, shard_id = checkpoint_target(model, target_name)
                param = params.get(name)
                if param is None:
                    raise ModelLoadError(f"unexpected weight {checkpoint_name!r} in {file.name}")
                try:
                    param.weight_loader(param, checkpoint.get_tensor(checkpoint_name), shard_id)
                except ValueError as error:
                    raise ModelLoadError(f"weight {checkpoint_name!r}: {error}") from error
                loaded.add((name, shard_id))
    expected = {(name, shard) for name, param in model.named_parameters() for shard in param.shard_ids}
    missing = sorted(f"{name}:{shard}" if shard is not None else name for name, shard in expected - loaded)
    if missing:
        raise ModelLoadError(f"checkpoint in {path.name} lacks {len(missing)} weight(s), e.g. {missing[:3]}")
    for module in model.modules():
        method = getattr(module, "method", None)
        if method is not None:
            method.process_weights_after_loading(module)
