"""The engine's own CPU operators (`csrc/cpu_kernels.cpp`): paged attention in place and small-batch matmuls.

Why a C++ extension: on a CPU, attention over a paged cache written in PyTorch has to copy every
cached block of every sequence into a padded tensor each step (a quarter of a decode step at
batch 64), and MKL's GEMM is several times slower for 2-8 rows than reading the weights once
would be. Two small loops in C++ remove both costs.

The library is built ahead of time by the project's install steps (`make run` / `make test` run
`python -m engine.model.cpu_kernels`), never on a request's path: at run time it is only loaded,
and only if a build of exactly this source for this torch exists. Without it the engine runs the
pure-PyTorch paths (`attention="sdpa"`, `F.linear`) and says why.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_kernels.cpp"
BUILD_ROOT = Path(__file__).resolve().parent.parent.parent / "build" / "cpu-kernels"
LIBRARY_NAME = "playground_cpu_kernels"
CFLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-Wno-psabi"]
OPS = "playground_cpu"
SMALL_BATCH_MAX_ROWS = 8
NOT_BUILT = ("the engine's CPU kernels are not built for this source and torch (run `make kernels` or "
             "`python -m engine.model.cpu_kernels`)")


def build_key() -> str:
    """What a build depends on: the source, the flags and the torch it links against."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
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

    path.parent.mkdir(parents=True, exist_ok=True)
    load(name=LIBRARY_NAME, sources=[str(SOURCE)], extra_cflags=CFLAGS, build_directory=str(path.parent),
         is_python_module=False, verbose=verbose)
    _register_fakes()
    return path


def _register_fakes() -> None:
    """Shapes of the operators' outputs for tracing (torch.compile), without running them."""
    if getattr(_register_fakes, "done", False):
        return

    @torch.library.register_fake(f"{OPS}::small_batch_linear")
    def _small_batch_linear(x, weight, bias):
        return x.new_empty((x.shape[0], weight.shape[0]))

    @torch.library.register_fake(f"{OPS}::paged_attention")
    def _paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len, context_lens, block_size,
                         scale, out):
        return None

    @torch.library.register_fake(f"{OPS}::rms_norm")
    def _rms_norm(x, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake(f"{OPS}::add_rms_norm")
    def _add_rms_norm(x, residual, weight, eps):
        return (torch.empty_like(x, memory_format=torch.contiguous_format),
                torch.empty_like(x, memory_format=torch.contiguous_format))

    @torch.library.register_fake(f"{OPS}::silu_mul")
    def _silu_mul(x):
        return x.new_empty((x.shape[0], x.shape[1] // 2))

    @torch.library.register_fake(f"{OPS}::rotary_")
    def _rotary(q, k, cos, sin):
        return None

    @torch.library.register_fake(f"{OPS}::store_kv")
    def _store_kv(k, v, k_cache, v_cache, slot_mapping):
        return None

    _register_fakes.done = True


# True once the library is loaded: a plain flag, cheap to test on every matmul and traceable by torch.compile.
LOADED = False


@functools.cache
def unavailable_reason() -> str | None:
    """Load the built library (once); why the CPU kernels cannot run here, or None when they are ready."""
    global LOADED
    if not SOURCE.is_file():
        return "the CPU kernel source is missing"
    path = library_path()
    if not path.is_file():
        return NOT_BUILT
    if not hasattr(torch.ops, OPS) or not hasattr(getattr(torch.ops, OPS), "paged_attention"):
        torch.ops.load_library(str(path))
    _register_fakes()
    LOADED = True
    return None


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels can compute on `x`: loaded, a CPU tensor, float32."""
    return LOADED and x.device.type == "cpu" and x.dtype == torch.float32


def is_built() -> bool:
    """Whether a build for this source and torch exists (cheap: does not load it)."""
    return library_path().is_file()


def paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len, context_lens, block_size: int,
                    scale: float, out) -> None:
    """Attention of q's rows over the paged cache, in place into `out` (see csrc/cpu_kernels.cpp)."""
    torch.ops.playground_cpu.paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len,
                                             context_lens, block_size, scale, out)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias) reading the weight once; meant for M <= SMALL_BATCH_MAX_ROWS."""
    return torch.ops.playground_cpu.small_batch_linear(x, weight, bias)


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


if __name__ == "__main__":
    print(f"built {build(verbose='-v' in sys.argv)}")
