"""Where the project is, for tests that start processes in it or read its files."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
