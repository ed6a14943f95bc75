"""`Engine`: the public API. Callers on any thread submit requests; one loop thread batches them all.

The engine turns prompts (text, token ids or chat messages) into token ids, validates them
against the context length, and hands them to a core: the native core (our model, scheduler and
paged KV cache) or the hf core (plain `transformers`, the baseline). Both are stepped by the same
loop here, so requests, streaming, cancellation and metrics behave the same on either.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Iterator

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import ModelLoadError, RequestError
from engine.loader import eos_token_ids, load_hf_config, load_tokenizer, resolve_model_path
from engine.metrics import StepRecord, describe_device
from engine.model import NATIVE_ARCHITECTURES
from engine.request import Request, RequestHandle, RequestOutput, StreamDelta
from engine.sampling import SamplingParams

log = logging.getLogger(__name__)

Prompt = str | list[int] | list[dict]
WARMUP_TOKENS = 4


def _is_single_prompt(prompts) -> bool:
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, list) and prompts:
        return all(isinstance(p, int) for p in prompts) or all(isinstance(p, dict) for p in prompts)
    return False


class Engine:
    """Loads a model, serves generate/stream calls from many threads through one batching loop."""

    def __init__(self, config: EngineConfig | None = None, **overrides):
        config = config or EngineConfig()
        config = config.replace(**overrides) if overrides else config.validate()
        started = time.perf_counter()
        notices: list[str] = []
        path = resolve_model_path(config.model)
        hf_config = load_hf_config(path)
        self.tokenizer = load_tokenizer(path)
        if self.tokenizer is None:
            notices.append("this model folder has no tokenizer: only token-id prompts work")
        architecture = (getattr(hf_config, "architectures", None) or ["unknown"])[0]
        native_ok = architecture in NATIVE_ARCHITECTURES
        if config.backend == "native" and not native_ok:
            raise ModelLoadError(f"architecture {architecture} is not covered by the native engine "
                                 f"(it runs {', '.join(NATIVE_ARCHITECTURES)}); use backend='hf'")
        if config.backend == "auto":
            config.backend = "native" if native_ok else "hf"
            if not native_ok:
                notices.append(f"{architecture} is not covered by the native engine: served by transformers")
        if config.backend == "native":
            from engine.native_core import NativeCore

            self._core = NativeCore(config, path, hf_config)
        else:
            from engine.hf_backend import HFCore

            self._core = HFCore(config, path, hf_config)
        notices.extend(getattr(self._core, "notices", []))
        config.max_model_len = self._core.max_model_len
        self.config = config
        self.eos_token_ids = eos_token_ids(path, hf_config, self.tokenizer)
        self._generator_seed = config.seed
        self._wakeup = threading.Condition()
        self._inbox: list[Request] = []
        self._closed = False
        self._loop = threading.Thread(target=self._run_loop, name="engine-loop", daemon=True)
        self._loop.start()
        self._warm_up()
        self.info = {
            "model": config.model, "path": str(path), "architecture": architecture, "backend": config.backend,
            "num_params": sum(p.numel() for p in self._core.model.parameters()), "vocab_size": self._core.vocab_size,
            "dtype": str(self._core.dtype).removeprefix("torch."), "device": self._core.device,
            "device_name": describe_device(), "attention": getattr(self._core, "attention_name", "transformers"),
            "cuda_graphs": getattr(self._core, "cuda_graphs", False),
            "max_model_len": self._core.max_model_len, "load_seconds": time.perf_counter() - started,
            "notices": notices,
        }

    def _warm_up(self) -> None:
        """Run one tiny request through the whole path, so a broken setup fails here, not on a user."""
        output = self.generate([[0] * WARMUP_TOKENS], SamplingParams(max_tokens=2, ignore_eos=True))[0]
        if output.finish_reason == "error":
            self.close()
            raise ModelLoadError(f"the engine failed its warm-up request: {output.error}")

    # ---- prompts -------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text, token ids, or chat messages rendered with the chat template."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, str | list) and self.tokenizer is None:
            raise RequestError("this model has no tokenizer: send token ids instead of text")
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if not getattr(self.tokenizer, "chat_template", None):
                raise RequestError("this model has no chat template: send plain text instead of messages")
            text = self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            raise RequestError("a prompt must be a string, a list of token ids or a list of chat messages")
        vocab = self._core.vocab_size
        if not ids:
            raise RequestError("the prompt is empty")
        if any(t < 0 or t >= vocab for t in ids):
            raise RequestError(f"token ids must be in [0, {vocab})")
        if len(ids) >= self.config.max_model_len:
            raise RequestError(f"the prompt is {len(ids)} tokens but max_model_len is {self.config.max_model_len}; "
                               "shorten it (at least one token must fit after it)")
        return ids

    def _make_request(self, prompt: Prompt, params: SamplingParams) -> Request:
        ids = self.encode(prompt)
        generator = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else torch.randint(2**62, (1,)).item()
            generator = torch.Generator().manual_seed(seed)
        return Request(ids, params, self.eos_token_ids, self.config.max_model_len,
                       IncrementalDetokenizer(self.tokenizer, ids, params.stop), generator)

    # ---- public API ----------------------------------------------------------------------------

    def submit(self, prompt: Prompt, params: SamplingParams | None = None) -> RequestHandle:
        """Queue one request; the handle streams its deltas, waits for its result or cancels it."""
        return self._submit_all([prompt], params)[0]

    def _submit_all(self, prompts: list[Prompt], params: SamplingParams | None) -> list[RequestHandle]:
        params = (params or SamplingParams()).validate()
        requests = [self._make_request(prompt, params) for prompt in prompts]
        with self._wakeup:
            if self._closed:
                raise RequestError("the engine is closed")
            self._inbox.extend(requests)
            self._wakeup.notify()
        return [RequestHandle(request, self._cancel_request(request)) for request in requests]

    def _cancel_request(self, request: Request):
        def cancel() -> None:
            request.cancel_requested = True
            with self._wakeup:
                self._wakeup.notify()
        return cancel

    def generate(self, prompts, params: SamplingParams | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. All prompts are validated before any is queued."""
        batch = [prompts] if _is_single_prompt(prompts) else list(prompts)
        return [handle.result() for handle in self._submit_all(batch, params)]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield text deltas as they are produced; closing the generator early cancels the request."""
        handle = self.submit(prompt, params)
        try:
            yield from handle
        finally:
            if not handle.done:
                handle.cancel()

    def stats(self) -> dict:
        return self._core.stats()

    def step_history(self, since: float = 0.0) -> list[StepRecord]:
        """The recent steps (newest last) that ended after `since` (a `time.perf_counter()` value)."""
        return [step for step in list(self._core.history) if step.time > since]

    def close(self) -> None:
        """Stop the loop, cancel what is pending and free the model and KV cache."""
        with self._wakeup:
            if self._closed:
                return
            self._closed = True
            self._wakeup.notify()
        self._loop.join()
        self._core.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the loop ------------------------------------------------------------------------------

    def _run_loop(self) -> None:
        core = self._core
        while True:
            with self._wakeup:
                while not (self._inbox or core.has_work() or self._closed):
                    self._wakeup.wait()
                if self._closed:
                    break
                arrivals, self._inbox = self._inbox, []
            for request in arrivals:
                core.add(request)
            for request in core.requests():
                if request.cancel_requested:
                    core.remove(request)
                    request.finish("cancelled")
            if not core.has_work():
                continue
            try:
                core.step()
            except Exception as error:  # a failed step fails its requests, never the engine
                log.error("engine step failed:\n%s", traceback.format_exc())
                for request in core.requests():
                    core.remove(request)
                    request.finish("error", f"{type(error).__name__}: {error}")
        for request in self._inbox + core.requests():
            request.finish("cancelled")
