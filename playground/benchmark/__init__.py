"""The Benchmark tab: a workload on the active configuration, measured as `python -m engine.bench` measures it."""
