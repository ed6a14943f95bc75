"""Running a test body at every x86-64 level of the engine's CPU kernels this CPU supports.

Why one helper: the kernel tests compare every level (AVX-512, AVX2, baseline) on one machine, and each must put the
best level back afterwards, whatever the body raised, or the tests after it would run slower kernels unawares.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.model import cpu_kernels


def each_kernel_level() -> Iterator[str]:
    """Switch to each level this CPU runs, best first, yielding its name; the best level is active again after."""
    levels = cpu_kernels.kernel_levels()
    try:
        for level in levels:
            cpu_kernels.use_kernel_level(level)
            yield level
    finally:
        cpu_kernels.use_kernel_level(levels[0])
