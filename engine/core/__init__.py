"""The serving core, plain Python and device-agnostic: requests and their lifecycle, the scheduler,
the block manager (block tables, ref counts, prefix hashing) and the metric definitions."""
