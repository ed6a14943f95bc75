"""The engine panel: every field of `EngineConfig`, the live check of what Apply would load, presets, Apply."""
