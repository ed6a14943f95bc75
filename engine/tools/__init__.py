"""Tools around the engine, not the engine itself: workloads and their measurement (shared by the bench and the
playground's Compare and Benchmark tabs), the roofline, the bench, the precision table and the GPU check.

The commands keep their short names (`python -m engine.bench`, `python -m engine.precision_table`,
`python -m engine.gpu_check`) through thin entry points beside the engine's API.
"""
