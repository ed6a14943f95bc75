"""Executing steps on the native model: a step's plan as plain data (`StepPlan`), the runner that
turns it into tensors and logits, the KV pool tensors, CUDA graphs for decode steps, and the
executors that run plans in this process or on N tensor-parallel worker processes."""
