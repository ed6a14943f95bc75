"""Ask Linux to back the weights a decode step streams through with 2 MiB pages.

Every decode step reads every weight once, in order; with 4 KiB pages that is a TLB miss per
4 KiB. Measured on the development CPU (one thread), every matmul of a batch-1 step of
random-llama-20m took 1.87 ms over 2 MiB pages instead of 2.00 ms. Linux's default
transparent-huge-page mode ("madvise") gives huge pages only to memory that asks (MADV_HUGEPAGE)
before it is first touched, which `advise_huge_pages` does for the 2 MiB-aligned interior of a
freshly allocated CPU tensor; weights are written once, at load, so the kernel's work of zeroing
(and compacting for) each huge page is paid there. The KV pool does not ask: its pages are first
written during serving, where those stalls cost more than the faster reads gain (runner/kv_cache.py).
Elsewhere (not Linux, a GPU tensor, a small tensor) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import torch

HUGE_PAGE = 2 * 2**20
MADV_HUGEPAGE = 14


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Advise huge pages for the tensor's memory (call before writing it); whether any region was advised."""
    madvise = _madvise()
    if madvise is None or tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    aligned_start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    aligned_end = end & ~(HUGE_PAGE - 1)
    if aligned_end <= aligned_start:
        return False
    return madvise(aligned_start, aligned_end - aligned_start, MADV_HUGEPAGE) == 0
