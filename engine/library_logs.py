"""Log records of the libraries the engine loads that nobody using the engine can act on, dropped at their loggers.

Why: loading any model through transformers imports its quantizers, which import torchao when it is
installed (it is: the `torchao-*` levels use it). torchao then tries to load its prebuilt extension
libraries (CUDA kernels, one built for Python 3.10 only) and logs a warning for each one this machine
cannot load, and it registers two enums with torch's pytree, which torch logs as deprecated. Both came
on every start of the app, every bench run and every tensor-parallel worker; the engine calls none of
those kernels, and neither message asks anything a user can do. bitsandbytes, imported at the app's
start since every module a request needs is imported then (`engine/preload.py`), asks on a CPU with
AVX-512 BF16 for the `kernels` package, which would fetch compiled code from the Hugging Face Hub
while loading: the engine never runs downloaded code, so nobody is meant to act on that either. Each
filter matches one logger and one message (for the pytree one, only torchao's own enums), so every
other record of those loggers, and every other warning, still shows.
"""

from __future__ import annotations

import logging
import re

_TORCHAO_EXTENSION = re.compile(r"^Failed to load \S*/torchao/_C[^/\s]*\.so\b")
_PYTREE_ENUM = "is an Enum subclass and is now natively supported"
_HUB_KERNELS = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _TorchaoExtensionLoads(logging.Filter):
    """torchao's "Failed to load .../torchao/_C*.so" warnings (its optional prebuilt extensions)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _TORCHAO_EXTENSION.match(record.getMessage())


class _TorchaoEnumRegistrations(logging.Filter):
    """torch's deprecation notice for `register_constant` of an Enum, when the Enum is torchao's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _PYTREE_ENUM not in str(record.msg) or not record.args:
            return True
        registered = record.args[0] if isinstance(record.args, tuple) else None
        return not str(getattr(registered, "__module__", "")).startswith("torchao")


class _HubKernelLoads(logging.Filter):
    """bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" (kernels fetched from the Hub)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_HUB_KERNELS)


FILTERS = {"torchao": _TorchaoExtensionLoads, "torch.utils._pytree": _TorchaoEnumRegistrations,
           "bitsandbytes.backends.cpu.ops": _HubKernelLoads}


def drop_unactionable_library_logs() -> None:
    """Install the filters (idempotent); before torchao is first imported, so its import-time records are covered."""
    for name, kind in FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(existing, kind) for existing in logger.filters):
            logger.addFilter(kind())
