"""Plain-words explanations of every toggle and every figure of the playground: what it is, what it trades.

Why one table: the same words appear as tooltips (each tab names the glossary term of its controls'
element ids, and the page script puts the entry on the element; tables of figures carry theirs as
`title`), and all of them together in the Glossary tab, so a figure means the same thing wherever
it is shown. The metric definitions are those of docs/metrics.md (the engine computes them in
engine/core/metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One term: its name as the page shows it, what it is, and what it trades (empty for a plain fact)."""

    name: str
    what: str
    trade: str = ""

    def tooltip(self) -> str:
        return f"{self.what} Trade-off: {self.trade}" if self.trade else self.what


TOGGLES = {
    "preset": Entry("optimization preset", "A named set of engine fields (presets/*.toml), applied as written: every "
                    "field it does not name goes back to its default; the model stays.",
                    "one click to a known configuration; it resets what you changed by hand."),
    "model": Entry("model", "The checkpoint that is served: a bundled model, a curated hub model or (locally) any "
                   "hub id or folder.", "bigger models answer better and need more memory and time per token."),
    "custom_model": Entry("model: hub id or local path", "Any Hugging Face hub id or local folder, instead of the "
                          "list (only where the server allows it).", "a hub model is downloaded on first use."),
    "backend": Entry("backend", "Which code serves the model: this project's native engine (paged KV cache, its own "
                     "scheduler), plain transformers (the baseline it is measured against), llama.cpp in this process "
                     "(llama-cpp-python: the CPU engine people compare against), or remote: another "
                     "server (vLLM, SGLang, llama.cpp's server, this app's /v1) reached over its OpenAI-compatible "
                     "API.", "native is the optimized path; hf is the reference and runs architectures native does "
                     "not; remote measures a server you run elsewhere on the same work, from this client."),
    "remote_url": Entry("remote_url", "The base URL of an OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1), "
                        "used with backend=remote.", "its figures are measured at this client: network time is in "
                        "them; a server's own /metrics are shown beside them where it has one."),
    "remote_model": Entry("remote_model", "The model name that server serves (its /v1/models lists them). Prompts "
                          "are encoded with the panel's model's tokenizer and sent as token ids (as text where the "
                          "server takes no ids).", "pick the same model in the panel, so both sides of a comparison "
                          "are given the same tokens."),
    "remote_api_key_env": Entry("remote_api_key_env", "The environment variable (of this server) that holds the "
                                "server's API key, sent as a Bearer token.", "the key itself is never shown, logged "
                                "or stored in the configuration; on a public server only the variables its host "
                                "names (PLAYGROUND_REMOTE_KEY_ENVS) may be used."),
    "device": Entry("device", "Where the model runs: CPU or a CUDA GPU (auto picks the GPU when there is one).",
                    "a GPU is much faster, and its memory is the budget."),
    "dtype": Entry("dtype", "Number format of weights and activations (float32, bfloat16, float16; auto = "
                   "bfloat16 on a GPU, float32 on a CPU).", "half precision halves memory and speeds a GPU up; "
                   "float32 is exact, which the correctness tests use."),
    "quantization": Entry("quantization", "Stores the weights in fewer bits (int8, 4-bit nf4/fp4, ...) and computes "
                          "with them dequantized or in integer kernels.", "weights take 2-6x less memory; quality "
                          "can drop a little (watch perplexity). On a CPU the engine's own native-int8 and "
                          "native-int4 decode faster than float32; the library levels are slower there. "
                          "sparse-2:4 prunes half the weights instead: faster only on a GPU's sparse kernels."),
    "gguf_type": Entry("gguf_type", "With backend=llama.cpp, the GGUF weight file llama.cpp runs: f32 (converted by "
                       "this project from the checkpoint), or f16, q8_0 (8-bit blocks of 32 with one scale) and q4_0 "
                       "(4-bit blocks of 32) made from it by llama.cpp's own quantizer.", "llama.cpp is the CPU "
                       "reference people compare against: native float32 against llama.cpp f32 and q8_0 is one "
                       "Compare run; llama.cpp serves one sequence at a time (no continuous batching here)."),
    "attention": Entry("attention", "The attention kernel that reads the KV cache: the engine's C++ CPU kernel "
                       "(reads paged blocks in place), torch SDPA, textbook eager, or flash-attn on a GPU.",
                       "fused kernels read K/V once and skip padding; eager is the simple reference."),
    "kv_layout": Entry("kv_layout", "How the KV cache is laid out: paged (fixed-size blocks handed out as a "
                       "sequence grows) or contiguous (max_model_len slots reserved per sequence up front).",
                       "paging wastes almost nothing, so more sequences fit; contiguous is simpler and "
                       "reserves memory that most sequences never use."),
    "kv_cache_dtype": Entry("kv_cache_dtype", "KV cache precision: what the KV cache stores: the model's dtype "
                            "(auto), float32, bfloat16, or int8 values with a float32 scale per token and head "
                            "(68 bytes per 64 values). The CPU kernel reads it in place; the PyTorch paths "
                            "dequantize the blocks they gather.", "int8 holds 3.8x the tokens of float32 in the same "
                            "memory and attention reads 4x fewer bytes; the rounding moves perplexity a little "
                            "(watch it)."),
    "block_size": Entry("block_size", "Tokens per KV block of the paged cache.", "small blocks waste less at "
                        "each sequence's end and share prefixes more finely; large blocks mean fewer table "
                        "entries and longer contiguous reads."),
    "prefix_caching": Entry("prefix_caching", "Keeps the KV blocks of prompt prefixes (hashed block by block) and "
                            "reuses them when a new prompt starts the same way (system prompts, chat history).",
                            "skips recomputing shared prefixes (lower TTFT); cached blocks stay resident until "
                            "the memory is needed."),
    "kv_cache_mib": Entry("kv_cache_bytes", "Memory reserved for the KV cache (0 = sized automatically from the "
                          "memory left after the weights).", "more KV memory holds more or longer sequences at "
                          "once; it is taken from everything else."),
    "batching": Entry("batching", "continuous: requests join and leave the running batch at every step; static: a "
                      "batch runs until its last request ends.", "continuous keeps the device busy and new "
                      "requests start sooner; static is the naive way, simpler and slower under load."),
    "max_num_seqs": Entry("max_num_seqs", "The most sequences one step may run together.", "a bigger batch raises "
                          "throughput and each request's wait for its tokens (TPOT), and needs more KV memory."),
    "max_num_batched_tokens": Entry("max_num_batched_tokens", "The most tokens one step may process; long prompts "
                                    "are split into chunks of it (chunked prefill).", "big chunks prefill faster; "
                                    "small chunks let running decodes keep streaming beside a long prompt."),
    "max_model_len": Entry("max_model_len", "The longest sequence (prompt + reply) the engine accepts (0 = the "
                           "model's own, up to the engine's default).", "a longer context needs more KV memory "
                           "per sequence (for a contiguous cache, reserved up front)."),
    "kv_memory_fraction": Entry("kv_memory_fraction", "Share of the memory free after loading that an automatic KV "
                                "cache takes (0 = the device's default).", "more KV room for sequences, less "
                                "headroom for everything else."),
    "speculative": Entry("speculative", "Speculative decoding: a cheap proposer (a small draft model, or n-gram "
                         "lookup in the prompt) guesses the next tokens and the model checks them all in one pass; "
                         "the output is exactly what the model alone would produce.", "fewer slow steps when "
                         "guesses are accepted; wasted work (and the draft's memory) when they are not."),
    "draft_model": Entry("draft_model", "The small model that proposes tokens (draft mode); it must share the "
                         "target's tokenizer.", "a better draft is accepted more often but costs more per guess."),
    "num_speculative_tokens": Entry("num_speculative_tokens", "Tokens proposed per step.", "more tokens gain more "
                                    "per step when accepted and waste more when the first guess is wrong."),
    "gqa": Entry("gqa", "Attention heads that share one K/V head: native keeps the checkpoint's heads, mha gives "
                 "every query head its own, a number pools the K/V heads into that many (GQA; 1 = MQA).",
                 "fewer KV heads shrink the KV cache and speed decode; pooling a checkpoint not trained for it "
                 "can wreck its answers: on the demo target 4 KV heads took held-out perplexity from 106 to 222 "
                 "(answers turned to gibberish), 2 heads to 1559 (the CPU precision table)."),
    "tensor_parallel_size": Entry("tensor_parallel_size", "Splits every layer's weights and the KV cache over this "
                                  "many worker processes (GPUs), which compute their shards and exchange results.",
                                  "a model too big for one device fits, and memory bandwidth adds up; every layer "
                                  "pays for the communication."),
    "pipeline_parallel_size": Entry(
        "pipeline_parallel_size", "Splits the decoder layers into this many stages, one process (GPU) each; a "
        "step's hidden states pass from stage to stage.", "a model too deep for one device fits with little "
        "communication (one activation per token between stages); stages wait on each other (the pipeline bubble) "
        "unless several micro-batches are in flight."),
    "pipeline_micro_batches": Entry(
        "pipeline_micro_batches", "How many parts a step's sequences are split into, so that stages work on "
        "different parts at once.", "more micro-batches shrink the bubble (N-1)/(m+N-1) but make each matmul "
        "smaller; 0 = one per stage."),
    "pipeline_schedule": Entry(
        "pipeline_schedule", "overlap keeps micro-batches of successive steps in flight together (vLLM's virtual "
        "engines); flush waits for a step's last micro-batch before the next step enters (GPipe).",
        "flush shows the textbook bubble; overlap hides it on a steady decode workload."),
    "disaggregation": Entry(
        "disaggregation", "prefill-decode: one worker computes prompts, another decodes; each request's K/V "
        "blocks move from the first to the second once its prompt is done.", "long prompts no longer stall "
        "everyone's decode steps; costs a K/V transfer per request (in its time to first token) and a second "
        "copy of the model."),
    "seed": Entry("seed", "The engine's own seed, used for requests that do not bring one.", "a fixed seed "
                  "repeats sampled outputs."),
    "cuda_graphs": Entry("cuda_graphs", "Records the GPU kernels of a decode step once and replays them.",
                         "removes launch overhead (small batches decode faster); costs capture time and memory."),
    "cpu_kernels": Entry("cpu_kernels", "The engine's C++ CPU kernels (paged attention in place, fused norms, "
                         "small-batch matmuls); off = pure PyTorch.", "faster on a CPU; pure PyTorch is the "
                         "reference path."),
    "system_prompt": Entry("system prompt", "Instructions placed before the conversation.", "every reply's prompt "
                           "gets longer (prefix caching makes that cheap after the first)."),
    "max_tokens": Entry("max_tokens", "The most new tokens per reply.", "longer replies take longer (E2EL)."),
    "temperature": Entry("temperature", "Randomness of sampling: 0 = always the most likely token (greedy).",
                         "higher values vary more and wander more."),
    "top_p": Entry("top_p", "Nucleus sampling: draw only from the most likely tokens whose probabilities add up to "
                   "top_p (1 = off).", "lower values are safer and less varied."),
    "top_k": Entry("top_k", "Draw only from the k most likely tokens (0 = off).", "lower values are safer and less "
                   "varied."),
    "sample_seed": Entry("seed (sampling)", "The seed a sampled reply draws with (blank = random).", "the same seed "
                         "repeats the same sampled reply."),
    "stop_strings": Entry("stop strings", "Text that ends a reply where it appears.", "shorter replies; a stop "
                          "string that is too common cuts replies short."),
    "structured_output": Entry("structured output", "Constrains the reply to a grammar while it is decoded: any JSON "
                               "object, JSON that validates against a JSON schema, or text that matches a regex. At "
                               "each step the engine masks every token that would leave the grammar; the line under "
                               "the reply says whether it is valid (checked again: jsonschema, a regex full match).",
                               "the reply always parses (unless cut by max_tokens); the mask costs time per token "
                               "(shown beside TPOT), and a first use compiles the grammar."),
    "structured_spec": Entry("schema or regex", "The JSON schema (as JSON) or the regex the reply must follow; a "
                             "schema keyword the grammar library cannot enforce is refused, not ignored.", ""),
    "token_probabilities": Entry("show token probabilities", "Asks the engine for each reply token's probability "
                                 "and the 5 most likely tokens at its step (log-softmax of the raw logits, before "
                                 "temperature and any grammar mask), and shows the finished reply as shaded tokens; "
                                 "hover one for its alternatives.", "a little work per step; the view is kept while "
                                 "the page is open, not in exports."),
    "compare_side": Entry("A / B configuration", "Where a side of the comparison starts: the engine panel as it "
                          "is now (applied or not) or a preset (with the panel's model); the changes box edits it.",
                          "both sides get the same prompts, seed and sampling, so the difference is the "
                          "configuration."),
    "compare_changes": Entry("changes", "Fields that differ from the chosen start, one KEY=VALUE per line or "
                             "comma, as `python -m engine.bench --set` takes them (quantization=int8, "
                             "kv_cache_bytes=64MiB).", ""),
    "compare_prompts": Entry("prompts", "The prompt set both sides answer, one prompt per line (each sent as a "
                             "chat message when the model has a chat template).", "more prompts measure more "
                             "evenly and take longer."),
    "compare_repeats": Entry("repeats", "How many times each side runs the prompts; the order alternates (A, B, "
                             "then B, A) and the table shows the median and the spread.", "more repeats average out "
                             "a noisy machine and take longer."),
    "compare_surge": Entry("surge (Compare)", "COUNT random prompts of INPUT tokens asking OUTPUT tokens each, sent "
                           "to each side once its replies to the prompts are half streamed (the Benchmark's surge).",
                           "A against B on what disaggregation is for: the table adds the prompts' p99 token gap "
                           "during the surge and outside it, and the surge's p99 TTFT."),
    "compare_structured_sides": Entry("structured output for", "Which sides send the structured output: B alone (A "
                                      "answers the same messages without the grammar, beside it), or A and B (two "
                                      "configurations under the same grammar; the baseline follows A).", ""),
    "compare_baseline": Entry("baseline", "Adds a third column: A's model served by a reference engine, every other "
                              "field at its default: plain transformers (backend=hf) in A's precision, or llama.cpp "
                              "in this process with one of its GGUF types (backend=llama.cpp).", "shows what the "
                              "engine's optimizations buy over the references people use; with B = the "
                              "llama-cpp-q8_0 preset and baseline llama.cpp f32, native float32 against llama.cpp "
                              "f32 and q8_0 is one run. One more engine to load."),
    "compare_perplexity": Entry("measure perplexity", "Also scores each side on the demo model's held-out text "
                                "(once per loaded engine, then cached).", "shows whether an optimization costs "
                                "quality; the first measurement takes a few seconds per engine."),
    "chat_both": Entry("chat with both", "Sends each message to A and B (and the baseline) and streams the replies "
                       "side by side; one side at a time, the first side alternating per message, so each reply's "
                       "figures are its own.", ""),
    "roofline_window": Entry("steps to place", "Which of the engine's recorded steps the roofline places: the "
                             "probe's, the last minute's, or every step it recorded (all sessions on this engine).",
                             "the probe is a controlled workload; your own chat shows the steps you caused."),
    "roofline_probe": Entry("Run probe", "Sends a short workload to the active engine: one, then 4, then 16 "
                            "sequences of 128 prompt tokens and 32 output tokens, so decode shows at three batch "
                            "sizes.", "a few seconds of the engine's time, shared with anyone chatting on it."),
    "roofline_remeasure": Entry("Measure ceilings again", "Measures the device's matmul peak and memory bandwidth "
                                "again (a few seconds) and keeps the best of each measurement so far.",
                                "on a busy machine a measurement falls short of the device; more runs get closer."),
    "measure_perplexity": Entry("Measure perplexity", "Scores the demo model's held-out text through this engine's "
                                "own forward pass, once per loaded configuration (then cached).",
                                "seconds of the engine's time (requests keep being served between its windows)."),
    "bench_dataset": Entry("dataset", "random: token-id prompts of the given lengths (need no tokenizer); chat: the "
                           "chat prompts kept in presets/chat_prompts.jsonl; upload: a .jsonl file with one "
                           "{\"prompt\": ...} or {\"messages\": [...]} per line.", ""),
    "bench_requests": Entry("requests", "How many requests the run sends.", "more requests give steadier "
                            "percentiles and take longer."),
    "bench_concurrency": Entry("concurrency", "The most requests in flight at once (0 = all of them).", "more in "
                               "flight raises throughput until the batch or the KV cache is full, and raises "
                               "every request's latency."),
    "bench_rate": Entry("request rate", "Poisson arrivals per second (0 = all at once): real traffic arrives "
                        "spread out, not all at time 0.", "a higher rate loads the engine more; above its "
                        "capacity, queues (and TTFT) grow."),
    "bench_input": Entry("input tokens", "Each random prompt's own tokens: one number, or LO:HI for a length "
                         "drawn per prompt.", "longer prompts cost more prefill (TTFT) and KV memory."),
    "bench_output": Entry("output tokens", "Tokens each request asks for: one number, or LO:HI per request.",
                          "longer outputs mean more decode steps; mixed lengths show what continuous batching "
                          "gains over static."),
    "bench_prefix": Entry("shared prefix", "Tokens every random prompt starts with (a system prompt, a shared "
                          "document).", "with prefix caching they are computed once and reused."),
    "bench_ignore_eos": Entry("ignore EOS", "Generate exactly the output length, even past the end-of-sequence "
                              "token (on for random prompts, as in vLLM's benchmarks).", "fixed work per request; "
                              "replies past EOS are meaningless text."),
    "bench_slo_ttft": Entry("TTFT objective", "Service-level objective on TTFT (ms) for goodput (0 = none).", ""),
    "bench_slo_tpot": Entry("TPOT objective", "Service-level objective on TPOT (ms) for goodput (0 = none).", ""),
    "bench_surge": Entry("surge", "A second class of requests: COUNT random prompts of INPUT tokens asking OUTPUT "
                         "tokens each, released at once when the other requests (the chat users) are half-way "
                         "through their answers.", "shows what a burst of long prompts does to users who are "
                         "decoding: the table splits the chat users' token gaps into those during the surge and "
                         "outside it (disaggregation keeps them apart)."),
    "bench_seed": Entry("seed (workload)", "Fixes the random prompts, lengths and arrival times (and the sampling "
                        "seeds).", "the same seed gives two configurations exactly the same work."),
}

FIGURES = {
    "ttft": Entry("TTFT", "Time to first token: first output token time - arrival of the request in the engine.",
                  "prefill work (prompt length, minus what the prefix cache holds) and queueing raise it."),
    "tpot": Entry("TPOT", "Time per output token after the first: (E2EL - TTFT) / (output tokens - 1).",
                  "bigger batches raise each request's TPOT and the engine's throughput."),
    "itl": Entry("ITL", "Inter-token latency: each gap between consecutive output tokens (all gaps of all "
                 "requests pooled).", "speculative decoding delivers tokens in bursts: short and long gaps."),
    "e2el": Entry("E2EL", "End-to-end latency: last token time - arrival.", ""),
    "request_throughput": Entry("request throughput", "Completed requests / duration (req/s).", ""),
    "request_goodput": Entry("goodput", "vLLM's request_goodput: completed requests that met every objective (TTFT "
                             "and/or TPOT at most the given ms; a one-token reply counts TPOT as 0) / duration.",
                             "throughput that breaks the objectives does not count."),
    "output_throughput": Entry("output throughput", "Output tokens / duration (tok/s).", ""),
    "total_token_throughput": Entry("total token throughput", "(Prompt + output tokens) / duration (tok/s).", ""),
    "duration": Entry("duration", "From the first request sent to the last one finished (seconds).", ""),
    "completed": Entry("completed", "Requests that produced output (cancelled ones excluded).", ""),
    "mean": Entry("mean / median / p90 / p99", "Over the run's requests (ITL: over every gap): the average, the "
                  "middle value, and the values 90% and 99% of them stay under (linear interpolation, like "
                  "numpy).", "tails (p99) show what the unluckiest requests wait."),
    "weights_bytes": Entry("weights", "Bytes of the model's weights, summed from tensor storage (quantized tensors "
                           "and their scales included).", ""),
    "kv_cache_bytes": Entry("KV cache", "Bytes allocated for the KV cache.", "more KV memory fits more and longer "
                            "sequences."),
    "kv_cache_used_bytes": Entry("KV in use", "Bytes of the KV cache that hold sequences right now.", ""),
    "peak_memory_bytes": Entry("peak memory", "Peak memory of the whole process: resident set (RSS) on a CPU, "
                               "torch.cuda.max_memory_allocated on a GPU; it covers every engine in the pool and "
                               "never goes down, so compare weights and KV for one configuration.", ""),
    "prefix_cache_hit_rate": Entry("prefix-cache hit rate", "Cached prompt tokens / prompt tokens.", ""),
    "spec_acceptance_rate": Entry("speculative acceptance", "Accepted / proposed speculative tokens (– when "
                                  "speculation is off).", "high acceptance is what makes speculation pay."),
    "perplexity": Entry("perplexity", "exp(mean negative log-likelihood) of the held-out text, through this "
                        "configuration's own forward pass: lower means the model predicts the text better.",
                        "on the demo target (CPU precision table) 8- and 4-bit weights moved it under 1% (106 to "
                        "106-107), 2:4 pruning raised it 10% (to 116), and pooling to 4 KV heads doubled it (to 222)."),
    "arithmetic_intensity": Entry("arithmetic intensity", "FLOPs a step does per byte it must move (weights read "
                                  "once per step, K/V read and written, embedding rows, logits).", ""),
    "ceilings": Entry("roofline ceilings", "The device's best measured matmul FLOP/s (in the engine's dtype) and "
                      "memory read bandwidth. Below intensity peak / bandwidth (the ridge) a step cannot beat "
                      "intensity x bandwidth: memory-bound; above it, the peak: compute-bound.", ""),
    "fraction_of_ceiling": Entry("fraction of its ceiling", "Achieved FLOP/s over what the roofline allows at the "
                                 "phase's intensity (for a memory-bound phase: bytes/s over the bandwidth).", ""),
    "projected_step": Entry("projected step time (estimate)", "What-if hardware: a measured step's work priced on "
                            "another device, max(FLOPs / peak FLOP/s at the configuration's precision, bytes / "
                            "memory bandwidth) + overhead, from the device's published dense figures. TTFT ≈ one "
                            "mean prefill step; TPOT ≈ one decode step at the measured batch size; tokens/s = batch "
                            "/ TPOT. An estimate, not a measurement.", "as good as its overhead term: the GPU's was "
                            "fitted to the committed GPU runs, which the tab shows beside their projections."),
    "step_overhead": Entry("per-step overhead", "The part of a step that neither roof counts: kernel launches, "
                           "scheduling, sampling, Python. On a GPU: base + per-sequence x batch, fitted by least "
                           "squares to (measured TPOT - roofline time) of the committed make gpu-check runs (eager "
                           "PyTorch, no CUDA graphs). On the device the steps ran on: the measured step time minus "
                           "its roofline time.", "CUDA graphs and bigger batches shrink it per token; a faster GPU "
                           "does not."),
    "projected_bound": Entry("bound (projected)", "Which of the three terms of the projected step time is largest: "
                             "compute (FLOPs / peak), memory (bytes / bandwidth) or overhead.", ""),
    "projected_toggle": Entry("toggle that would move it most", "Read from the dominant term: overhead-bound decode "
                              "on a GPU: CUDA graphs, else a bigger batch; memory-bound: whichever bytes dominate "
                              "(K/V: int8 KV cache or fewer KV heads; weights: bfloat16 from float32 on a GPU, "
                              "native-int8 on a CPU, else quantization, else a bigger batch); compute-bound: "
                              "bfloat16 from float32 where the device's tensor cores are faster, else prefix caching "
                              "(prefill) or fewer FLOPs.", ""),
    "projection_error": Entry("projection error", "Projected / measured - 1, for the decode TPOT of a committed GPU "
                              "run on the same device: how far the estimate is from what that device did.", ""),
    "guided_mask_ms": Entry("guided mask per token", "Structured output's cost in a run: the engine's measured time "
                            "computing and applying the grammar's token masks, summed over the run's finished "
                            "requests, per output token (– for a side without structured output).", ""),
    "guided_mask_share": Entry("guided mask, share of TPOT", "The mask work per output token over the run's mean "
                               "TPOT: the part of each token's time the grammar costs.", ""),
    "spec_tokens_per_step": Entry("tokens per verification step", "Tokens a speculative step produced per sequence: "
                                  "its accepted proposals plus the target's own token (1 = speculation gained "
                                  "nothing).", ""),
    "collective_share": Entry("TP communication", "Share of model-step time rank 0 spent in all-reduce / all-gather "
                              "(waiting for the slower rank included) under tensor parallelism.", ""),
    "peak_running": Entry("peak running", "The most sequences that ran in one step.", ""),
    "cancelled_requests": Entry("cancelled", "Requests the run did not finish (never sent, or cancelled in "
                                "flight).", ""),
    "zerogpu_call": Entry("ZeroGPU call", "ZeroGPU mode (a ZeroGPU Space): the GPU is attached only while one call "
                          "runs, in a forked worker, so each reply, Compare side and benchmark is one call that "
                          "rebuilds the engine from the checkpoint. Under a reply: the call's wall time, the "
                          "duration it asked for (the tokens asked x this configuration's measured step time, plus "
                          "its load time, with a margin) and the rebuild's part.",
                          "no GPU is held between requests, but every call pays the rebuild, and nothing of an "
                          "engine (prefix cache, CUDA graphs) survives from one call to the next."),
}

ENTRIES = {**TOGGLES, **FIGURES}


def tooltip(term: str) -> str:
    """The tooltip text of a toggle or figure ("" for an unknown term)."""
    entry = ENTRIES.get(term)
    return entry.tooltip() if entry else ""


def element_tooltips(terms: dict[str, str]) -> dict[str, str]:
    """Element id -> tooltip, for the page script, from element id -> glossary term."""
    return {element: tooltip(term) for element, term in terms.items()}
