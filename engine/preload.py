"""Importing, once and on the caller's thread, every module that loading an engine or serving a request imports.

Why: the engine imports several libraries only when a configuration needs them (transformers' auto classes and the
classes of the architectures it serves, the hf backend, the quantization libraries, llama.cpp's binding), and
transformers' lazy module is not safe to import from two threads at once: while the playground's warm-up load was
still importing transformers, an Apply on another thread failed with "cannot import name 'AutoConfig' from
'transformers'". A server calls `import_serving_modules()` at start-up, before it takes requests, so that no request
imports a module.
"""

from __future__ import annotations

import importlib
import importlib.util

from engine.host import llama_cpp_available
from engine.model.spec import NATIVE_ARCHITECTURES
from engine.quant.levels import LEVELS

# Modules the engine imports inside functions (each where a configuration first needs it), and what they import on
# first use.
ENGINE_MODULES = ("engine.backends.native", "engine.backends.hf", "engine.backends.pipelined",
                  "engine.backends.disaggregated", "engine.backends.llama_cpp", "engine.runner.tp_executor",
                  "huggingface_hub", "llguidance.hf",
                  "safetensors.torch", "torch.distributed", "torch.multiprocessing", "torch.utils.cpp_extension",
                  "transformers.generation.configuration_utils", "transformers.modeling_rope_utils",
                  "httpcore", "h11")  # the last two: what httpx imports when a RemoteEngine builds its client
TRANSFORMERS_NAMES = ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "GenerationConfig",
                      "StoppingCriteriaList", "BitsAndBytesConfig", "QuantoConfig", "TorchAoConfig")
# The parts of the quantization libraries that their levels call, beyond each library's top module.
QUANTIZATION_MODULES = {"bitsandbytes": ("bitsandbytes.functional",),
                        "optimum.quanto": ("optimum.quanto.library.extensions",),
                        "torchao": ("torchao.quantization",)}


def import_serving_modules() -> list[str]:
    """Import everything above that is installed (flash-attn too, where it is); returns the modules imported."""
    import transformers

    for name in TRANSFORMERS_NAMES + NATIVE_ARCHITECTURES:
        getattr(transformers, name)
    libraries = {level.module for level in LEVELS.values() if level.installed()}
    optional = [module for library in sorted(libraries) for module in (library, *QUANTIZATION_MODULES.get(library, ()))]
    if importlib.util.find_spec("flash_attn") is not None:
        optional.append("flash_attn")
    if llama_cpp_available():
        optional += ["llama_cpp", "gguf"]
    modules = [*ENGINE_MODULES, *optional]
    for module in modules:
        importlib.import_module(module)
    return modules
