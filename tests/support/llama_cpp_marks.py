"""What the llama.cpp tests share: their skip mark (the packages are test-only: `make test` installs them)."""

from __future__ import annotations

import pytest

from engine.host import llama_cpp_available

needs_llama_cpp = pytest.mark.skipif(
    not llama_cpp_available(),
    reason="llama-cpp-python and gguf are not installed (requirements-test.txt pins them; `make test` installs them)")
