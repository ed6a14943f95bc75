"""The choice controls of the engine panel: which values can run on this host, and what each one means.

Why a module: the panel's help lines, the page's CSS and script (which grey out and disable the
choices that cannot run), and the help line that follows the selected choice all read the engine's
own answers (`unavailable_reason`, `choice_note`), so the UI never claims more than the engine does.
"""

from __future__ import annotations

import json

from engine import CHOICES, choice_note, unavailable_reason
from playground.shared import zero_gpu as zero_gpu_mode

RADIO_FIELDS = ("backend", "device", "dtype", "quantization", "gguf_type", "attention", "kv_layout", "kv_cache_dtype",
                "batching", "speculative", "pipeline_schedule", "disaggregation")
GQA_CHOICES = ["native", "mha", "1", "2", "4", "8"]
TP_CHOICES = [1, 2, 4, 8]
PP_CHOICES = [1, 2, 4, 8]
DROPDOWN_CHOICES = {"gqa": GQA_CHOICES, "tensor_parallel_size": TP_CHOICES, "pipeline_parallel_size": PP_CHOICES}
HELP = {
    "backend": "native engine, plain transformers (baseline), llama.cpp in this process, or a server elsewhere",
    "device": "where the model runs",
    "dtype": "weight and activation precision",
    "quantization": "how the weights are stored and multiplied: packed levels, or 2:4 pruning",
    "gguf_type": "llama.cpp's weight file (backend=llama.cpp): f32, f16, or its q8_0 / q4_0 blocks",
    "attention": "attention kernel over the KV cache",
    "kv_layout": "paged blocks, or one contiguous slab per sequence",
    "kv_cache_dtype": "KV cache precision: what the cache stores (auto = the model's dtype)",
    "batching": "continuous: join and leave every step; static: whole batches",
    "speculative": "propose tokens cheaply, verify them in one pass",
    "gqa": "native heads, MHA, or a number of KV heads (GQA/MQA)",
    "tensor_parallel_size": "shard the model over worker processes",
    "pipeline_parallel_size": "split the layers into stages, one process each",
    "pipeline_schedule": "overlap: micro-batches of successive steps in flight together; flush: each step drains "
                         "the pipeline (the textbook bubble)",
    "disaggregation": "prefill-decode: one worker prefills prompts, another decodes, K/V moved between them",
}


def engine_value(value):
    """A control's value as the engine takes it (the gqa and tensor-parallel dropdowns hold digit strings)."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def all_values(field_name: str) -> list:
    return CHOICES[field_name] if field_name in CHOICES else DROPDOWN_CHOICES[field_name]


def unavailable_choices(field_name: str, zero_gpu: bool = False) -> dict:
    """value -> why it cannot run on this host (or, with `zero_gpu`, in ZeroGPU mode), for the choices of one control
    that cannot."""
    return {value: reason for value in all_values(field_name)
            if (reason := unavailable_reason(field_name, engine_value(value))
                or (zero_gpu and zero_gpu_mode.refusal(field_name, engine_value(value))))}


def usable_choices(field_name: str, zero_gpu: bool = False) -> list:
    unavailable = unavailable_choices(field_name, zero_gpu)
    return [value for value in all_values(field_name) if value not in unavailable]


def _why_not(unavailable: dict) -> str:
    """The help-line suffix naming unusable choices, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for value, reason in unavailable.items():
        generic = " ".join(reason.replace(repr(value), "").replace(f"({value})", "").split())
        by_reason.setdefault(generic, []).append(str(value))
    return "".join(f" · disabled: {', '.join(values)} ({reason})" for reason, values in by_reason.items())


def help_line(field_name: str, value, zero_gpu: bool = False) -> str:
    """A control's help line: what it does, which choices cannot run here and why, and the selected choice's note."""
    line = HELP[field_name] + _why_not(unavailable_choices(field_name, zero_gpu))
    if isinstance(value, str | int) and not isinstance(value, bool) and value in all_values(field_name):
        note = choice_note(field_name, engine_value(value))
        if note:
            line += f" · {value}: {note}"
    return line


def page_css(zero_gpu: bool = False) -> str:
    """Greys out the radio choices that cannot run on this host (the rules depend on the host and ZeroGPU mode)."""
    rules = []
    for field_name in RADIO_FIELDS:
        for value in unavailable_choices(field_name, zero_gpu):
            selector = f'#ctl-{field_name} label:has(input[value="{value}"])'
            rules.append(f"{selector} {{ opacity: .45; pointer-events: none; text-decoration: line-through; }}")
    return "\n".join(rules)


def page_script_data(zero_gpu: bool = False) -> str:
    """For the page script: per radio field, the reason each unusable choice cannot run and the note of the others."""
    data = {}
    for field_name in RADIO_FIELDS:
        unavailable = unavailable_choices(field_name, zero_gpu)
        notes = {value: choice_note(field_name, value) for value in CHOICES[field_name] if value not in unavailable}
        data[field_name] = {"unavailable": {str(v): r for v, r in unavailable.items()},
                            "notes": {str(v): n for v, n in notes.items() if n}}
    return json.dumps(data)
