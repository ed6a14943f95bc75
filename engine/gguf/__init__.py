"""GGUF files of the engine's checkpoints, for the llama.cpp backend (docs/llama-cpp.md).

Why a package of our own: llama.cpp reads GGUF only, and the comparison with it is only fair when both engines run
the very same weights; the project converts its Llama checkpoints itself (`convert.py`: hyperparameters, tensors with
llama.cpp's rotary row order, the tokenizer in `vocab.py`), then lets llama.cpp's own quantizer make the smaller
types, cached beside the checkpoint (`files.py`).
"""

GGUF_TYPES = ("f32", "f16", "q8_0", "q4_0")
