"""The Compare tab: two configurations (and the transformers baseline) on the same prompts, side by side."""
