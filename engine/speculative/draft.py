"""The draft-model proposer, and which draft a configuration gets (and which it refuses).

The draft is a second native model, smaller than the target and of the same vocabulary. Its KV pool
has as many blocks as the target's and it reads the target's block tables (vLLM v1 gives a draft's
layers their cache the same way): a block is allocated, shared by the prefix cache, preempted and
freed for both models at once, so the draft needs no block manager of its own, and every block of
both pools is free when the requests end.

Each step, before the scheduler runs, the draft catches up with the target in one forward pass over
every running request (the prompt chunks the target computed last step, the tokens accepted since,
and the newest token), scoring the last position of requests that propose; then one forward pass
per further proposal, for all proposing requests together (when they are all greedy and few, every
further position in one kernel call that feeds each argmax back in: `ModelRunner.greedy_proposals`).
The K/V it wrote for proposals that the target rejects is not undone, only forgotten:
`draft_num_computed_tokens` rolls back to the accepted tokens, and those slots are overwritten later.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.errors import ModelLoadError
from engine.hub import load_tokenizer
from engine.model.linear import BuildContext
from engine.model.llama import LlamaForCausalLM
from engine.model.sampler import SamplingTensors, counter_uniform, filtered_probs, sample_from
from engine.model.spec import NATIVE_ARCHITECTURES, ModelSpec, checkpoint_architecture
from engine.runner.model_runner import ModelRunner
from engine.runner.step_plan import SequenceChunk, StepPlan
from engine.speculative.verify import STREAM_DRAFT


def check_draft(name: str, path: Path, hf_config, target_path: Path, target_hf_config) -> ModelSpec:
    """The draft's shapes, refusing a draft the engine cannot verify against the target."""
    architecture = checkpoint_architecture(hf_config)
    if architecture not in NATIVE_ARCHITECTURES:
        raise ModelLoadError(f"draft {name!r} is a {architecture}; a draft runs in the native engine "
                             f"({', '.join(NATIVE_ARCHITECTURES)})")
    check_same_vocabulary(name, target_path, target_hf_config, path, hf_config)
    spec = ModelSpec.from_hf_config(hf_config)
    draft_params, target_params = native_parameters(spec), native_parameters(ModelSpec.from_hf_config(target_hf_config))
    if draft_params >= target_params:
        raise ModelLoadError(f"draft {name!r} has {draft_params:,} parameters, not fewer than the target's "
                             f"{target_params:,}: it cannot save time; pick a smaller draft")
    return spec


def native_parameters(spec: ModelSpec) -> int:
    """Parameters of the native model of `spec` (tied weights once), counted on the meta device."""
    empty = torch.empty(0)
    model = LlamaForCausalLM(spec, None, BuildContext(torch.float32, "meta"), empty, empty)
    return sum(p.numel() for p in model.parameters())


def check_same_vocabulary(name: str, target_path: Path, target_hf_config, draft_path: Path, draft_hf_config) -> None:
    """A draft's token ids must mean what the target's mean: identical tokenizers (their embedding
    tables may be padded to different sizes), or, without tokenizers, identical vocabulary sizes."""
    target_vocab, draft_vocab = target_hf_config.vocab_size, draft_hf_config.vocab_size
    target_tokenizer, draft_tokenizer = load_tokenizer(target_path), load_tokenizer(draft_path)
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise ModelLoadError(f"draft {name!r}: only one of the target and the draft has a tokenizer, so they "
                             "cannot be checked to share one")
    if target_tokenizer is None:
        if draft_vocab != target_vocab:
            raise ModelLoadError(f"draft {name!r} has a vocabulary of {draft_vocab} tokens, the target {target_vocab}")
        return
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ModelLoadError(f"draft {name!r} has a different tokenizer from the target: its token ids would mean "
                             "other text; pick a draft of the same model family")
    if min(draft_vocab, target_vocab) < len(target_tokenizer):
        raise ModelLoadError(f"draft {name!r}: an embedding table of {min(draft_vocab, target_vocab)} rows is "
                             f"smaller than the tokenizer's {len(target_tokenizer)} tokens")


class DraftModelProposer:
    """Proposes with the draft model, batched over every running request, one forward per position."""

    def __init__(self, runner: ModelRunner, block_manager: BlockManager, vocab_size: int):
        self.runner = runner
        self.block_manager = block_manager
        self.vocab_size = vocab_size
        self.written: dict[int, int] = {}

    def propose(self, requests: list[Request], lengths: list[int]) -> tuple[list[list[int]],
                                                                            list[torch.Tensor | None]]:
        """Catch every request's draft K/V up with the target; propose up to `lengths[i]` tokens for request i
        (0 for requests that are not ready to decode). Returns the proposals and, for sampled requests, the
        distributions they were drawn from ([len, target vocab]; None for greedy requests)."""
        self.written.clear()
        lengths = [self._fit(request, length) for request, length in zip(requests, lengths, strict=True)]
        proposals: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        chunks, active = [], []
        for index, (request, length) in enumerate(zip(requests, lengths, strict=True)):
            start = request.draft_num_computed_tokens
            end = request.num_tokens if length else request.num_computed_tokens
            if end > start:
                chunks.append(SequenceChunk(request.all_token_ids[start:end], start,
                                            list(self.block_manager.block_table(request.request_id)), int(length > 0),
                                            request.request_id))
                request.draft_num_computed_tokens = end
            if length:
                active.append(index)
        if not chunks:
            return proposals, [None] * len(requests)
        every_chunk_proposes = [chunk.seq_id for chunk in chunks] == [requests[i].request_id for i in active]
        if not (every_chunk_proposes and self._propose_greedily(chunks, active, requests, lengths, proposals)):
            self._propose_stepwise(chunks, active, requests, lengths, proposals, probs)
        for request, proposed in zip(requests, proposals, strict=True):
            if proposed:
                self.written[request.request_id] = len(proposed) - 1
        return proposals, [torch.stack(rows) if rows else None for rows in probs]

    def _propose_stepwise(self, chunks: list[SequenceChunk], active: list[int], requests: list[Request],
                          lengths: list[int], proposals: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
        """One forward pass for the catch-up chunks, then one per proposal position, drawing each request's
        proposals as it would sample; greedy requests hand their remaining positions to one kernel call."""
        logits = self.runner.execute(StepPlan(chunks))
        depth = 0
        while active:
            depth += 1
            drawn, drawn_probs, valid = self._draw(logits, [requests[i] for i in active], depth)
            for row, index in enumerate(active):
                if valid[row]:
                    proposals[index].append(drawn[row])
                    if drawn_probs[row] is not None:
                        probs[index].append(drawn_probs[row])
            active = [index for row, index in enumerate(active) if valid[row] and lengths[index] > depth]
            if not active:
                return
            step = [SequenceChunk([proposals[i][-1]], requests[i].num_tokens + depth - 1,
                                  list(self.block_manager.block_table(requests[i].request_id)), 1,
                                  requests[i].request_id) for i in active]
            if self._propose_greedily(step, active, requests, [length - depth for length in lengths], proposals):
                return
            logits = self.runner.execute(StepPlan(step))

    def _propose_greedily(self, chunks: list[SequenceChunk], active: list[int], requests: list[Request],
                          lengths: list[int], proposals: list[list[int]]) -> bool:
        """When every active request is greedy, its chunk and all its further proposals in one kernel call of the
        draft's runner (the tokens the stepwise loop would draw); False where that path does not apply."""
        if any(requests[i].params.temperature > 0 for i in active):
            return False
        continued = self.runner.greedy_proposals(chunks, [lengths[i] for i in active], self.vocab_size)
        if continued is None:
            return False
        for index, tokens in zip(active, continued, strict=True):
            proposals[index].extend(tokens)
        return True

    def _fit(self, request: Request, length: int) -> int:
        """Shorten a proposal to the KV slots the request holds or can take without crowding others out
        (the draft writes K/V at its newest token and all proposals but the last), growing its table."""
        if length <= 0:
            return 0
        manager = self.block_manager
        table = manager.block_table(request.request_id)
        spare = max(manager.num_free_blocks - len(manager.tables), 0)
        room = (len(table) + spare) * manager.block_size - request.num_tokens + 1
        length = min(length, room)
        if length > 0:
            manager.grow(request.request_id, request.num_tokens + length - 1)
        return max(length, 0)

    def _draw(self, logits: torch.Tensor, requests: list[Request], depth: int):
        """Each request's proposal at `depth` (1 = right after its newest token), drawn like the target would
        sample it but on the draft's own random stream; invalid rows (non-finite logits) end a proposal.
        Greedy requests take the argmax (a point mass: no distribution is kept for them)."""
        logits = logits[:, :self.vocab_size]
        tokens = torch.argmax(logits, dim=-1)
        valid = torch.isfinite(logits).all(dim=-1)
        row_probs: list[torch.Tensor | None] = [None] * len(requests)
        sampled = [row for row, request in enumerate(requests) if request.params.temperature > 0]
        if sampled:
            chosen = [requests[row] for row in sampled]
            index = torch.tensor(sampled, device=logits.device)
            settings = SamplingTensors.build(
                [r.params.temperature for r in chosen], [r.params.top_k for r in chosen],
                [r.params.top_p for r in chosen], [r.seed for r in chosen],
                [len(r.output_token_ids) + depth - 1 for r in chosen], logits.device)
            probs = filtered_probs(logits.index_select(0, index), settings.temperature, settings.top_k, settings.top_p)
            if probs.shape[-1] < self.vocab_size:
                probs = torch.nn.functional.pad(probs, (0, self.vocab_size - probs.shape[-1]))
            probs = torch.nan_to_num(probs, nan=0.0)
            tokens[index] = sample_from(probs, counter_uniform(settings.seeds, settings.positions, STREAM_DRAFT))
            valid[index] &= probs.sum(dim=-1) > 0
            for row, request_row in enumerate(sampled):
                row_probs[request_row] = probs[row]
        return tokens.tolist(), row_probs, valid.tolist()

    def rollback(self, request: Request, num_accepted: int) -> None:
        """Keep the draft K/V of the accepted proposals it wrote; forget the rest."""
        request.draft_num_computed_tokens += min(num_accepted, self.written.pop(request.request_id, 0))

    def release(self, request: Request) -> None:
        self.written.pop(request.request_id, None)

    def close(self) -> None:
        self.runner.close()
