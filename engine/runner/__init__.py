"""Executing steps on the native model: a step's plan as plain data (`StepPlan`), the runner that
turns it into tensors and logits, the KV pool tensors, and CUDA graphs for decode steps."""
