"""One llama.cpp model and context in this process, through the llama-cpp-python binding's C API.

Why the C API and not the binding's `Llama` class: the engine needs llama.cpp's raw logits for chosen positions
(its own sampler picks the tokens, so greedy and seeded sampling mean what they mean on the other backends), control
of which KV positions are kept (the prefix shared with the previous request), and no per-context copy of every
position's logits (`Llama` keeps an n_ctx x vocab array for that). The session holds one sequence (id 0).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from engine.errors import ModelLoadError

BINDING_LOGGER = "llama-cpp-python"  # the binding prints llama.cpp's log lines at or above this logger's level
SEQUENCE = 0


def load_binding():
    """The `llama_cpp` module, with llama.cpp's loading and quantizing chatter (info lines per tensor) kept off
    stderr: only its errors print."""
    import llama_cpp

    logging.getLogger(BINDING_LOGGER).setLevel(logging.ERROR)
    llama_cpp.llama_backend_init()
    return llama_cpp


class LlamaCppSession:
    """A GGUF model with a context of `n_ctx` positions for one sequence, decoding up to `n_batch` tokens a call."""

    def __init__(self, gguf_file: Path, n_ctx: int, n_batch: int, threads: int, float32_kv: bool):
        self._lib = lib = load_binding()
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = lib.llama_model_load_from_file(str(gguf_file).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {gguf_file.name}")
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        if float32_kv:  # the float32 reference: K/V stored as computed, and attention on its plain float32 path
            params.type_k = params.type_v = lib.GGML_TYPE_F32
            params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._context = lib.llama_init_from_model(self._model, params)
        if not self._context:
            lib.llama_model_free(self._model)
            raise ModelLoadError(f"llama.cpp could not make a context of {n_ctx} positions for {gguf_file.name}")
        self.n_ctx = lib.llama_n_ctx(self._context)
        self.n_batch = n_batch
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        self._memory = lib.llama_get_memory(self._context)
        self._batch = lib.llama_batch_init(n_batch, 0, 1)

    def decode(self, tokens: list[int], start: int, every_logit: bool = False) -> torch.Tensor:
        """Run `tokens` (at most `n_batch`) at positions start, start + 1, ...; their K/V join the sequence. Returns
        the next-token logits after the last token ([1, vocab]), or after each token with `every_logit`."""
        batch = self._batch
        count = len(tokens)
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = start + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = SEQUENCE
            batch.logits[index] = every_logit or index == count - 1
        batch.n_tokens = count
        status = self._lib.llama_decode(self._context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed (status {status}) on {count} token(s) at position {start}")
        rows = count if every_logit else 1
        pointer = (self._lib.llama_get_logits(self._context) if every_logit
                   else self._lib.llama_get_logits_ith(self._context, -1))
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab)).copy())

    def keep(self, length: int) -> None:
        """Forget the sequence's K/V from position `length` on."""
        self._lib.llama_memory_seq_rm(self._memory, SEQUENCE, length, -1)

    def close(self) -> None:
        if self._context:
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._context)
            self._lib.llama_model_free(self._model)
            self._context = self._model = None
