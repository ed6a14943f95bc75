"""The engine panel's layout and wiring: the preset, every control of `EngineConfig`, the engine pool, the
check line, Apply and its status, and the `/apply` and `/apply_preset` endpoints.

Every control is labelled with its EngineConfig field name, and its initial value is the default
configuration (so the `/apply` API has the panel's defaults). Choices the engine cannot use here are
disabled with the reason (radio buttons greyed out and not clickable, dropdowns without them), and
the reason is in the control's help line.
"""

from __future__ import annotations

import gradio as gr

from engine import CHOICES, unavailable_reason
from playground.engine_panel.choices import DROPDOWN_CHOICES, RADIO_FIELDS, help_line, usable_choices
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from playground.engine_panel.handlers import APPLY_OUTPUTS, PanelHandlers
from playground.shared.settings import MIB

BLOCK_SIZES = [8, 16, 32, 64, 128, 256]
# element id -> glossary term, for the tooltips
TOOLTIPS = {**{f"ctl-{name}": name for name in FORM_FIELDS if name != "custom_model"},
            "ctl-custom-model": "custom_model", "preset": "preset"}
PRIVATE = {"api_visibility": "private"}


def _radio(field_name: str, value, zero_gpu: bool) -> gr.Radio:
    """All choices; the ones that cannot run here are greyed out and blocked by the page's CSS and script."""
    return gr.Radio(CHOICES[field_name], value=value, label=field_name, info=help_line(field_name, value, zero_gpu),
                    elem_id=f"ctl-{field_name}", elem_classes=["ctl"])


def _dropdown(field_name: str, value, zero_gpu: bool) -> gr.Dropdown:
    """Only the usable choices; the rest are named in the help line. One usable choice: not editable."""
    usable = usable_choices(field_name, zero_gpu)
    return gr.Dropdown(usable, value=value, label=field_name, info=help_line(field_name, value, zero_gpu),
                       interactive=len(usable) > 1, elem_id=f"ctl-{field_name}", elem_classes=["ctl"])


def _controls(panel: PanelHandlers) -> dict:
    """The engine panel's controls by form field name, showing the default configuration."""
    context = panel.context
    settings, form = context.settings, config_to_form(context.default_config.to_dict(), context.curated)
    zero_gpu = settings.zero_gpu  # ZeroGPU mode disables the choices it cannot run, saying why
    controls: dict = {}
    controls["model"] = gr.Dropdown(panel.model_choices(), value=form["model"], label="model", elem_classes=["ctl"],
                                    elem_id="ctl-model", allow_custom_value=True,
                                    info=panel.model_info(form["model"])["info"])
    controls["custom_model"] = gr.Textbox(
        value=form["custom_model"], label="model: hub id or local path", elem_id="ctl-custom-model",
        placeholder="e.g. HuggingFaceTB/SmolLM2-135M-Instruct", info="overrides the list when set",
        visible=not settings.curated_only, elem_classes=["ctl"])
    with gr.Accordion("Execution", open=True, elem_classes=["group"]):
        for field_name in ("backend", "device", "dtype", "quantization", "gguf_type", "attention"):
            controls[field_name] = _radio(field_name, form[field_name], zero_gpu)
    with gr.Accordion("Served elsewhere (backend=remote)", open=False, elem_classes=["group"]):
        remote_note = ("" if not settings.public or settings.remote_allow_list else
                       " · off on this public server: its host allows no base URL (PLAYGROUND_REMOTE_ALLOW)")
        controls["remote_url"] = gr.Textbox(
            value=form["remote_url"], label="remote_url", elem_id="ctl-remote_url", elem_classes=["ctl"],
            placeholder="e.g. http://127.0.0.1:8000/v1",
            info="an OpenAI-compatible server's base URL (vLLM, SGLang, llama.cpp's server, this app's /v1)"
                 + remote_note)
        controls["remote_model"] = gr.Textbox(
            value=form["remote_model"], label="remote_model", elem_id="ctl-remote_model", elem_classes=["ctl"],
            info="the model name the server serves; prompts are encoded with the model above's tokenizer")
        controls["remote_api_key_env"] = gr.Textbox(
            value=form["remote_api_key_env"], label="remote_api_key_env", elem_id="ctl-remote_api_key_env",
            elem_classes=["ctl"], info="the environment variable holding its API key (the key is never shown)")
    with gr.Accordion("KV cache", open=True, elem_classes=["group"]):
        controls["kv_layout"] = _radio("kv_layout", form["kv_layout"], zero_gpu)
        controls["kv_cache_dtype"] = _radio("kv_cache_dtype", form["kv_cache_dtype"], zero_gpu)
        controls["block_size"] = gr.Dropdown(BLOCK_SIZES, value=form["block_size"], label="block_size",
                                             info="tokens per KV block", elem_id="ctl-block_size", elem_classes=["ctl"])
        controls["prefix_caching"] = gr.Checkbox(value=form["prefix_caching"], label="prefix_caching",
                                                 elem_id="ctl-prefix_caching", elem_classes=["ctl"],
                                                 info="reuse KV blocks of a shared prompt prefix (paged only)")
        kv_cap = context.max_kv_cache_bytes // MIB if context.max_kv_cache_bytes else None
        controls["kv_cache_mib"] = gr.Number(
            value=form["kv_cache_mib"], label="kv_cache_bytes (MiB)", minimum=0, maximum=kv_cap,
            info="KV budget; 0 = automatic" + (f" · at most {kv_cap} MiB here" if kv_cap else ""),
            elem_id="ctl-kv_cache_mib", elem_classes=["ctl"])
    with gr.Accordion("Batching", open=True, elem_classes=["group"]):
        controls["batching"] = _radio("batching", form["batching"], zero_gpu)
        controls["max_num_seqs"] = gr.Slider(1, settings.max_num_seqs or 256, value=form["max_num_seqs"], step=1,
                                             label="max_num_seqs", info="most sequences in one batch",
                                             elem_id="ctl-max_num_seqs", elem_classes=["ctl"])
        controls["max_num_batched_tokens"] = gr.Number(
            value=form["max_num_batched_tokens"], label="max_num_batched_tokens", precision=0, minimum=1,
            maximum=settings.max_num_batched_tokens, info="token budget of one step (chunked prefill)",
            elem_id="ctl-max_num_batched_tokens", elem_classes=["ctl"])
        controls["max_model_len"] = gr.Number(
            value=form["max_model_len"], label="max_model_len", precision=0, minimum=0, maximum=settings.max_model_len,
            info="context length; 0 = the model's own (up to the engine's default)", elem_id="ctl-max_model_len",
            elem_classes=["ctl"])
        controls["kv_memory_fraction"] = gr.Number(
            value=form["kv_memory_fraction"], label="kv_memory_fraction", minimum=0, maximum=1, step=0.05,
            info="share of the memory available at load for an automatic KV cache; 0 = the device's default",
            elem_id="ctl-kv_memory_fraction", elem_classes=["ctl"])
    with gr.Accordion("Speculative decoding", open=False, elem_classes=["group"]):
        controls["speculative"] = _radio("speculative", form["speculative"], zero_gpu)
        spec_on = form["speculative"] != "off"
        controls["draft_model"] = gr.Dropdown(
            [("(the model's curated draft)", "")] + [(n, n) for n in context.models], value=form["draft_model"],
            label="draft_model", elem_id="ctl-draft_model", elem_classes=["ctl"], allow_custom_value=True,
            interactive=form["speculative"] == "draft", info="the small model that proposes (draft mode only)")
        controls["num_speculative_tokens"] = gr.Slider(
            1, 8, value=form["num_speculative_tokens"], step=1, label="num_speculative_tokens", interactive=spec_on,
            info="tokens proposed per step (only while speculative decoding is on)",
            elem_id="ctl-num_speculative_tokens", elem_classes=["ctl"])
    with gr.Accordion("Attention heads, parallelism, advanced", open=False, elem_classes=["group"]):
        controls["gqa"] = _dropdown("gqa", form["gqa"], zero_gpu)
        for field_name in ("tensor_parallel_size", "pipeline_parallel_size"):
            controls[field_name] = _dropdown(field_name, form[field_name], zero_gpu)
        controls["pipeline_micro_batches"] = gr.Number(
            value=form["pipeline_micro_batches"], label="pipeline_micro_batches", precision=0, minimum=0, maximum=64,
            info="micro-batches a step is split into across the stages; 0 = one per stage (pipelining only)",
            elem_id="ctl-pipeline_micro_batches", elem_classes=["ctl"])
        controls["pipeline_schedule"] = _radio("pipeline_schedule", form["pipeline_schedule"], zero_gpu)
        controls["disaggregation"] = _radio("disaggregation", form["disaggregation"], zero_gpu)
        controls["seed"] = gr.Number(value=form["seed"], label="seed", precision=0, minimum=0,
                                     info="the engine's seed (requests without their own seed)",
                                     elem_id="ctl-seed", elem_classes=["ctl"])
        no_cuda = unavailable_reason("device", "cuda")
        controls["cuda_graphs"] = gr.Checkbox(value=form["cuda_graphs"], label="cuda_graphs", interactive=not no_cuda,
                                              info="capture decode steps as CUDA graphs"
                                                   + (f" · disabled: {no_cuda}" if no_cuda else ""),
                                              elem_id="ctl-cuda_graphs", elem_classes=["ctl"])
        controls["cpu_kernels"] = gr.Checkbox(value=form["cpu_kernels"], label="cpu_kernels",
                                              info="the engine's C++ CPU kernels (pure PyTorch when off or not built)",
                                              elem_id="ctl-cpu_kernels", elem_classes=["ctl"])
    return controls


def build_engine_panel(panel: PanelHandlers, ui: dict) -> None:
    """The panel's components, added to `ui` under their names (call inside the panel's column): the preset and
    the controls with the pool in an accordion, then the check line, Apply and its status below it."""
    with gr.Accordion("Engine", open=True, elem_id="engine-acc"):
        ui["preset"] = gr.Dropdown(panel.context.presets, value=None, label="optimization preset",
                                   info="applied as written: its fields, every other field at its "
                                        "default (the model stays)", elem_id="preset", elem_classes=["ctl"])
        ui.update(_controls(panel))
        ui["pool"] = gr.HTML(elem_id="pool")
    with gr.Column(elem_id="apply-bar"):  # outside the accordion, so it sticks to the panel's bottom
        ui["check"] = gr.HTML(elem_id="check")
        ui["apply"] = gr.Button("Apply", variant="primary", elem_id="apply")
        ui["status"] = gr.HTML(elem_id="apply-status")


def wire_engine_panel_api(panel: PanelHandlers, ui: dict, form: list, extras, session) -> None:
    """`/apply` and `/apply_preset` for API clients (gradio_client): a status line, the loaded configuration and
    the engine's figures, or a clear error."""
    with gr.Group(visible=False):
        status, config, engine = gr.Textbox(label="status"), gr.JSON(label="config"), gr.JSON(label="engine")
        apply, apply_preset = gr.Button("apply"), gr.Button("apply_preset")
    # preprocess=False: the handlers parse every raw value themselves (Gradio's choice checks refused the digit
    # strings its API description lists, and its number checks raised on text)
    apply.click(panel.api_apply, [*form, extras, session], [status, config, engine], api_name="apply",
                concurrency_limit=1, concurrency_id="engine-load", preprocess=False)
    apply_preset.click(panel.api_apply_preset, [ui["preset"], session], [status, config, engine],
                       api_name="apply_preset", concurrency_limit=1, concurrency_id="engine-load", preprocess=False)


def wire_engine_panel(panel: PanelHandlers, ui: dict, form: list, extras, session) -> None:
    """The panel's events: the check on every change, the fields that follow speculation, the help lines, Apply
    and the preset (one load at a time on this server)."""
    for control in form:  # always_last: a change made while a check runs is checked after it, never dropped
        control.input(panel.check, [*form, extras, session], [ui["check"], ui["apply"]], queue=False,
                      trigger_mode="always_last", show_progress="hidden", **PRIVATE)
    ui["speculative"].change(panel.dependent_fields, ui["speculative"], [ui["draft_model"],
                             ui["num_speculative_tokens"]], queue=False, show_progress="hidden", **PRIVATE)
    ui["model"].change(panel.model_info, ui["model"], ui["model"], queue=False, show_progress="hidden", **PRIVATE)
    for field_name in (*RADIO_FIELDS, *DROPDOWN_CHOICES):  # the help line follows the selected choice's note
        ui[field_name].change(panel.choice_help(field_name), ui[field_name], ui[field_name], queue=False,
                              show_progress="hidden", **PRIVATE)
    outputs = [ui[name] for name in APPLY_OUTPUTS]
    load_kwargs = dict(concurrency_limit=1, concurrency_id="engine-load", show_progress="hidden", **PRIVATE)
    ui["apply"].click(panel.apply, [*form, extras, session], outputs, **load_kwargs)
    ui["preset"].select(panel.preset, [ui["preset"], session], outputs, **load_kwargs)
