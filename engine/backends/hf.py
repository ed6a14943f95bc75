"""The hf backend: the engine's API over plain `transformers`, the baseline of every comparison.

It is stepped by the same engine loop as the native core, so requests, streaming, cancellation and
metrics behave the same; only the work underneath differs:

- `batching="static"`: `model.generate` on a left-padded batch of up to `max_num_seqs` waiting
  requests that share sampling parameters. A `StoppingCriteria` sees every step's tokens, hands
  them to their requests as they are produced (real per-token timestamps) and stops rows that are
  done or cancelled. `max_num_seqs=1` is plain sequential `generate`.
- `batching="continuous"`: transformers' own continuous batching (`init_continuous_batching`, the
  manager behind `generate_batch`), fed with streaming requests; its thread records a timestamp per
  token, which is what the metrics use. Its sampler is one global setting, so the manager runs
  greedy requests and sampled ones go through `generate` (said in `notices`).

The native-only knobs (paged vs contiguous layout, CUDA graphs, ...) have no meaning here; the plan
lists them in its notices rather than dropping them silently, and sizes the continuous batching pages.
A `quantization` level is applied through transformers' own quantization config for the same
library (`engine/quant/levels.py`), so native and baseline compare like for like; checkpoints that
come pre-quantized (GPTQ, AWQ) load here only, on a CUDA GPU with their kernels installed.
"""

from __future__ import annotations

import logging
import queue
import time
import traceback
from collections import deque
from collections.abc import Callable

import torch

from engine.backends.base import next_token_log_probs
from engine.core.metrics import peak_memory_bytes
from engine.core.request import Request
from engine.errors import ModelLoadError
from engine.info import EngineStats, StepRecord
from engine.plan import EnginePlan, hf_attention_implementation
from engine.quant.checkpoint import prequantized_method
from engine.quant.levels import LEVELS
from engine.quant.storage import parameter_count, weight_storage_bytes

CB_POLL_SECONDS = 0.005
CB_STOP_TIMEOUT_SECONDS = 10.0

log = logging.getLogger(__name__)


def _sampling_key(request: Request) -> tuple:
    """Requests with equal keys can share one `generate` call (greedy ignores the other fields)."""
    params = request.params
    if params.greedy:
        return ("greedy",)
    return ("sample", params.temperature, params.top_p, params.top_k, params.seed)


class _StepFeeder:
    """The `generate` callback: hands each step's new tokens to their requests and says which rows are done.

    transformers calls stopping criteria once per generated token with the full `input_ids`, so
    the last column holds the token just produced for every row.
    """

    def __init__(self, core: HFBackend, requests: list[Request], prompt_tokens: int):
        self.core = core
        self.requests = requests
        self.done = [False] * len(requests)
        self.last = time.perf_counter()
        self.first = True
        self.prompt_tokens = prompt_tokens

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        tokens = input_ids[:, -1].tolist()
        now = time.perf_counter()
        active = [row for row, done in enumerate(self.done) if not done]
        num_tokens = self.prompt_tokens + len(active) if self.first else len(active)
        self.core.record_step(now, now - self.last, len(active), num_tokens, len(active), len(active))
        for row in active:
            request = self.requests[row]
            if request.cancel_requested:
                request.finish("cancelled")
            else:
                request.append_tokens([tokens[row]], now)
            self.done[row] = request.finished
        self.first = False
        self.last = now
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


class HFBackend:
    """Serves the engine's requests with plain transformers: `generate` or its continuous batching manager."""

    def __init__(self, plan: EnginePlan):
        config = plan.config
        self.device = plan.device
        self.dtype = plan.dtype
        self.max_model_len = plan.max_model_len
        self.batching = config.batching
        self.max_num_seqs = config.max_num_seqs
        torch.manual_seed(config.seed)
        self.model = self._load_model(plan)
        self.num_params = parameter_count(self.model)
        self.draft_num_params = 0
        self.pad_token_id = self._pad_token_id(plan.hf_config)
        self._record: Callable[[StepRecord], None] = lambda step: None
        self.steps = 0
        self.peak_running = 0
        self.prompt_tokens = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.manager = None
        self._cb_ids: dict[str, Request] = {}
        self._cb_delivered: dict[str, int] = {}
        self._last_drain = time.perf_counter()
        if self.batching == "continuous":
            self._start_manager(plan)

    # ---- setup ---------------------------------------------------------------------------------

    def _load_model(self, plan: EnginePlan):
        """The transformers model on its device, quantized by its library's transformers config when asked (the
        plan refused a level or a pre-quantized checkpoint this device and dtype cannot take)."""
        from transformers import AutoModelForCausalLM

        config = plan.config
        prequantized = prequantized_method(plan.hf_config)
        level = LEVELS.get(config.quantization)
        options = {}
        if level is not None or prequantized:  # transformers places quantized models; `.to()` is refused for them
            options["device_map"] = {"": self.device}
        if level is not None:
            options["quantization_config"] = level.hf_config(self.dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(plan.path, dtype=self.dtype, trust_remote_code=False,
                                                         use_safetensors=True,
                                                         attn_implementation=hf_attention_implementation(config),
                                                         **options)
        except OSError as error:  # no safetensors file: pickled checkpoints are never loaded
            raise ModelLoadError(f"cannot load safetensors weights from {plan.path.name}: "
                                 f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
        except (ImportError, RuntimeError, ValueError) as error:  # a quantization backend missing or refusing
            if not (prequantized or level):
                raise
            what = f"its {prequantized} quantization" if prequantized else f"quantization={config.quantization!r}"
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ModelLoadError(f"transformers cannot load this model with {what} here: {first_line}") from error
        return (model if options else model.to(self.device)).eval()

    def _pad_token_id(self, hf_config) -> int:
        generation = getattr(self.model, "generation_config", None)
        for value in (getattr(generation, "pad_token_id", None), getattr(hf_config, "pad_token_id", None)):
            if isinstance(value, int):
                return value
        return 0

    def _start_manager(self, plan: EnginePlan) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        config = plan.config
        cb_config = ContinuousBatchingConfig(
            page_size=plan.block_size, num_blocks=plan.num_kv_blocks,
            max_batch_tokens=config.max_num_batched_tokens, max_requests_per_batch=config.max_num_seqs,
            allow_block_sharing=config.prefix_caching, auto_switch_to_flash=False, seed=config.seed)
        generation_config = GenerationConfig(do_sample=False, max_new_tokens=self.max_model_len, eos_token_id=-1,
                                             pad_token_id=self.pad_token_id)
        self.manager = self.model.init_continuous_batching(generation_config=generation_config,
                                                           continuous_batching_config=cb_config)
        self.manager.start()

    # ---- the core protocol ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.num_cached_tokens = 0
        self.prompt_tokens += len(request.prompt_token_ids)
        if self.manager is not None and request.params.greedy:
            self._cb_add(request)
        else:
            self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._cb_ids)

    def requests(self) -> list[Request]:
        return list(self.running) + list(self.waiting) + list(self._cb_ids.values())

    def abort(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        key = str(request.request_id)
        if key in self._cb_ids:
            self._cb_forget(key)
            self.manager.cancel_request(key)

    def step(self, record: Callable[[StepRecord], None]) -> None:
        self._record = record
        if self.waiting:
            self._generate_batch()
        if self._cb_ids:
            self._cb_drain()

    def record_step(self, now: float, duration: float, batch_size: int, num_tokens: int, num_decode_tokens: int,
                    num_running: int) -> None:
        self.steps += 1
        self.peak_running = max(self.peak_running, batch_size)
        self._record(StepRecord(time=now, duration=duration, batch_size=batch_size, num_tokens=num_tokens,
                                       num_decode_tokens=num_decode_tokens, num_running=num_running,
                                       kv_blocks_used=0, num_output_tokens=num_decode_tokens))

    # ---- static batching: model.generate -------------------------------------------------------

    def _take_batch(self) -> list[Request]:
        key = _sampling_key(self.waiting[0])
        batch = [r for r in self.waiting if _sampling_key(r) == key][:self.max_num_seqs]
        for request in batch:
            self.waiting.remove(request)
        return batch

    def _generate_batch(self) -> None:
        from transformers import StoppingCriteriaList

        batch = self._take_batch()
        self.running = batch
        lengths = [len(r.prompt_token_ids) for r in batch]
        width = max(lengths)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - lengths[row]:] = torch.tensor(request.prompt_token_ids)
            attention_mask[row, width - lengths[row]:] = 1
        max_new = max(min(r.params.max_tokens, self.max_model_len - n) for r, n in zip(batch, lengths, strict=True))
        params = batch[0].params
        sampling = {"do_sample": False}
        if not params.greedy:
            sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
                        "top_k": params.top_k}
            if params.seed is not None:
                torch.manual_seed(params.seed)
        feeder = _StepFeeder(self, batch, sum(lengths))
        try:
            with torch.no_grad():  # not inference_mode: quanto's int4 weights are re-viewed on every call
                self.model.generate(
                    input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                    max_new_tokens=max_new, min_new_tokens=0, eos_token_id=None, pad_token_id=self.pad_token_id,
                    stopping_criteria=StoppingCriteriaList([feeder]), num_beams=1, use_cache=True, **sampling)
        except Exception as error:  # a failed call fails its own requests; the engine keeps serving
            log.error("generate failed:\n%s", traceback.format_exc())
            for request in batch:
                request.finish("error", f"{type(error).__name__}: {error}")
        finally:
            for request in batch:
                if not request.finished and request.cancel_requested:
                    request.finish("cancelled")
            self.running = [r for r in batch if not r.finished]
            if self.running:  # generate stopped early (should not happen): fail rather than hang
                for request in self.running:
                    request.finish("error", "generate returned before the request finished")
                self.running = []

    # ---- continuous batching: transformers' manager --------------------------------------------

    def _cb_add(self, request: Request) -> None:
        key = str(request.request_id)
        max_new = min(request.params.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        eos = -1 if request.params.ignore_eos or not request.eos_token_ids else sorted(request.eos_token_ids)
        self._cb_ids[key] = request
        self._cb_delivered[key] = 0
        self.manager.add_request(list(request.prompt_token_ids), request_id=key, max_new_tokens=max_new,
                                 streaming=True, record_timestamps=True, eos_token_id=eos)

    def _cb_forget(self, key: str) -> None:
        self._cb_ids.pop(key, None)
        self._cb_delivered.pop(key, None)

    def _cb_drain(self) -> None:
        """Hand every token the manager produced since the last call to its request, with its own timestamp."""
        outputs = []
        try:
            outputs.append(self.manager.output_router.output_queue.get(timeout=CB_POLL_SECONDS))
            while True:
                outputs.append(self.manager.output_router.output_queue.get_nowait())
        except queue.Empty:
            pass
        now = time.perf_counter()
        if not self.manager.is_running():
            for key, request in list(self._cb_ids.items()):
                request.finish("error", "transformers' continuous batching thread stopped")
                self._cb_forget(key)
            return
        if outputs:
            self._cb_record(outputs, now)
        for output in outputs:
            request = self._cb_ids.get(output.request_id)
            if request is None:  # removed meanwhile (cancelled, or already stopped by a stop string)
                continue
            if output.error is not None:
                request.finish("error", output.error)
                self._cb_forget(output.request_id)
                continue
            start = self._cb_delivered[output.request_id]
            fresh = output.generated_tokens[start:]
            stamps = (output.timestamps or [])[start:]
            for index, token in enumerate(fresh):
                request.append_tokens([token], stamps[index] if index < len(stamps) else now)
                if request.finished:
                    break
            self._cb_delivered[output.request_id] = start + len(fresh)
            if request.finished:
                self._cb_forget(output.request_id)
                if not output.is_finished():
                    self.manager.cancel_request(output.request_id)
            elif output.is_finished():
                request.finish("length")
                self._cb_forget(output.request_id)

    def _cb_record(self, outputs: list, now: float) -> None:
        """One step record for the tokens the manager produced since the last drain.

        A drain can hold several streamed snapshots of one request, each with all its tokens so far:
        only the latest counts, or the same tokens would be counted once per snapshot.
        """
        generated = {output.request_id: len(output.generated_tokens) for output in outputs
                     if output.request_id in self._cb_ids and output.error is None}
        new_tokens = sum(count - self._cb_delivered[request_id] for request_id, count in generated.items())
        scheduler = getattr(self.manager.batch_processor, "scheduler", None)
        running = len(getattr(scheduler, "active_requests", {})) if scheduler is not None else len(self._cb_ids)
        self.record_step(now, now - self._last_drain, len(outputs), new_tokens, new_tokens, running)
        self.peak_running = max(self.peak_running, running)
        self._last_drain = now

    # ---- figures -------------------------------------------------------------------------------

    def _cb_cache(self):
        processor = getattr(self.manager, "batch_processor", None) if self.manager is not None else None
        return getattr(processor, "cache", None)

    def decode_profile(self, since: float) -> None:
        """transformers' steps happen inside its own generate loops: not profiled section by section."""
        return None

    def score(self, token_ids: list[int], chunk_tokens: int | None = None) -> torch.Tensor:
        """Next-token log-probabilities after each of token_ids[:-1], from one transformers forward pass: its
        attention reads K/V in the model's dtype whatever the chunking, so `chunk_tokens` would compute the same."""
        with torch.no_grad():  # not inference_mode, as in `_generate_batch`
            logits = self.model(input_ids=torch.tensor([token_ids], device=self.device)).logits[0, :-1]
        return next_token_log_probs(logits)

    def forget_warm_up(self) -> None:
        self.steps = self.peak_running = 0

    def stats(self) -> EngineStats:
        cache = self._cb_cache()
        kv_bytes = used_bytes = total_blocks = free_blocks = 0
        note = ("transformers' generate grows a fresh cache per call: its size is not tracked, 0 here"
                if self.batching == "static" else
                "transformers' paged cache (its prefix sharing is not counted: hit rate 0 here)")
        if cache is not None:
            kv_bytes = int(cache.cache_tensor.nbytes)
            used_bytes = max(0, kv_bytes - int(cache.compute_free_capacity(relative=False)))
            total_blocks = int(cache.num_blocks)
            free_blocks = int(total_blocks * cache.compute_free_capacity(relative=True))
        return EngineStats(
            weights_bytes=weight_storage_bytes(self.model), kv_cache_bytes=kv_bytes, kv_cache_used_bytes=used_bytes,
            kv_blocks_total=total_blocks, kv_blocks_free=free_blocks,
            kv_block_size=self.manager.continuous_batching_config.page_size if self.manager else 0,
            num_running=len(self.running) + len(self._cb_ids), num_waiting=len(self.waiting),
            peak_running=self.peak_running, num_preemptions=0, prefix_cache_hit_rate=0.0, spec_acceptance_rate=0.0,
            peak_memory_bytes=peak_memory_bytes(self.device), steps=self.steps, notes=(note,))

    def close(self) -> None:
        if self.manager is not None:
            try:
                self.manager.stop(block=True, timeout=CB_STOP_TIMEOUT_SECONDS)
                self.manager.destroy()
            except Exception:  # closing must not raise; the thread is a daemon of transformers
                log.warning("stopping transformers' continuous batching failed:\n%s", traceback.format_exc())
            self.manager = None
        self.model = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
