"""The engine's own CPU operators (`csrc/`), for float32 models on a CPU.

Why a C++ extension: attention over a paged cache written in PyTorch has to copy every cached
block of every sequence into a padded tensor each step (a quarter of a decode step at batch 64);
MKL's GEMM is several times slower for 2-8 rows than reading the weights once would be; and a
small model's decode step is mostly the fixed cost of ~50 small eager operations per layer. The
operators: paged attention reading K/V in place, small-batch matmuls, and one pass each for
RMSNorm (with the residual sum before it), rotary embedding, the KV store and SiLU-and-multiply.

The library is built ahead of time by the project's install steps (`make kernels`, which `make run` and
`make test` run too), never on a request's path: at run time it is only loaded,
and only if a build of exactly this source for this torch exists. Without it the engine runs the
pure-PyTorch paths (`attention="sdpa"`, `F.linear`) and says why.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
BUILD_ROOT = Path(__file__).resolve().parent.parent.parent / "build" / "cpu-kernels"
LIBRARY_NAME = "playground_cpu_kernels"
# -fopenmp: the kernels spread work with at::parallel_for, which is a header template; compiled without OpenMP it
# runs every range on the calling thread. Linked the same way, the library takes the libgomp torch has loaded.
CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-Wno-psabi"]
LDFLAGS = ["-fopenmp"]
OPS = "playground_cpu"
NOT_BUILT = "the engine's CPU kernels are not built for this source and torch (run `make kernels`)"
# Runs the kernels at a lower x86-64 level than the CPU's best (e.g. "avx2" on an AVX-512 machine), to measure what a
# CPU without the better level would get from the same code; read once, when the library loads.
KERNEL_LEVEL_ENV = "PLAYGROUND_KERNEL_LEVEL"


def sources() -> list[Path]:
    """The files compiled into the library (each `.cpp` of csrc/)."""
    return sorted(SOURCE_DIR.glob("*.cpp"))


def build_key() -> str:
    """What a build depends on: every source and header, the flags and the torch it links against."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.glob("*.[ch]*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(CFLAGS + LDFLAGS).encode())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def library_path() -> Path:
    return BUILD_ROOT / build_key() / f"{LIBRARY_NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compile the library (a minute or two on two cores) unless this exact build exists; return its path."""
    path = library_path()
    if path.is_file():
        return path
    from torch.utils.cpp_extension import load

    # The pinned `ninja` package installs its binary next to this interpreter, which need not be on PATH.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    path.parent.mkdir(parents=True, exist_ok=True)
    load(name=LIBRARY_NAME, sources=[str(path) for path in sources()], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
         build_directory=str(path.parent), is_python_module=False, verbose=verbose)
    if not path.is_file():
        built = sorted(p.name for p in path.parent.iterdir())
        raise RuntimeError(f"the CPU kernel build finished without {path.name} in {path.parent} (found {built})")
    return path


_loaded: Path | None = None


def unavailable_reason() -> str | None:
    """Load the built library (once); why the CPU kernels cannot run here, or None when they are ready."""
    global _loaded
    if _loaded is not None:
        return None
    if not sources():
        return "the CPU kernel sources are missing"
    path = library_path()
    if not path.is_file():
        return NOT_BUILT
    torch.ops.load_library(str(path))
    _loaded = path
    level = os.environ.get(KERNEL_LEVEL_ENV)
    if level:
        if level not in kernel_levels():
            raise RuntimeError(f"{KERNEL_LEVEL_ENV}={level!r}: this CPU runs the kernels at {kernel_levels()}")
        use_kernel_level(level)
    return None


def is_built() -> bool:
    """Whether a build for this source and torch exists (cheap: does not load it)."""
    return library_path().is_file()


def paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len, context_lens, block_size: int,
                    scale: float, out) -> None:
    """Attention of q's rows over the paged cache, in place into `out` (see csrc/cpu_kernels.cpp)."""
    torch.ops.playground_cpu.paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len,
                                             context_lens, block_size, scale, out)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias), each weight row read once per 8 rows of x (see model/matmul.py)."""
    return torch.ops.playground_cpu.small_batch_linear(x, weight, bias)


def kernel_levels() -> list[str]:
    """The x86-64 levels (vector widths) this CPU runs the attention and small-batch kernels at, best first."""
    return list(torch.ops.playground_cpu.kernel_levels())


def use_kernel_level(name: str) -> str:
    """Run those kernels at `name` (one of `kernel_levels()`; the best is the default); returns the previous level."""
    return torch.ops.playground_cpu.use_kernel_level(name)


def parallel_threads_used(tasks: int) -> int:
    """How many of torch's intra-op threads the kernels' work-splitting ran `tasks` ranges on (1 when built without
    OpenMP, whatever `torch.get_num_threads()` says)."""
    return torch.ops.playground_cpu.parallel_threads_used(tasks)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension, in one pass."""
    return torch.ops.playground_cpu.rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass."""
    return torch.ops.playground_cpu.add_rms_norm(x, residual, weight, eps)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dimension."""
    return torch.ops.playground_cpu.silu_mul(x)


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q [tokens, heads, dim] and k in place by their tokens' cos/sin [tokens, dim] (rotate-half style)."""
    torch.ops.playground_cpu.rotary_(q, k, cos, sin)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Copy K/V [tokens, kv_heads, dim] into their slots of head-major caches."""
    torch.ops.playground_cpu.store_kv(k, v, k_cache, v_cache, slot_mapping)

