"""The native Llama-family decoder and its layers: linear layers that load their own weights (and regroup
K/V heads under GQA conversion, `gqa`), attention over the paged KV cache, rotary embeddings, norms, the
batched sampler, and the checkpoint walker that hands each tensor to its layer's loader."""
