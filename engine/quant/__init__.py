"""Weight quantization: what the native model's loading does to its weights.

`levels` maps each `quantization` level to the library made for it (bitsandbytes, optimum-quanto,
torchao); `methods` turns a level into the `LinearMethod` the model's linear layers are built
with; `storage` counts the bytes quantized weights really hold; `checkpoint` recognises checkpoints
that come already quantized.
"""
