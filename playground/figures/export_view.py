"""The engine panel's "Run this configuration on vLLM / SGLang" block: the launch command(s) for the session's
configuration on each target (`engine.tools.export`), with every setting that has no equivalent named.

A `<details>` element, closed until opened, so it costs the panel one line; pure markup from the configuration.
"""

from __future__ import annotations

import html

from engine import EXPORT_TARGETS, EngineConfig, EngineError, export_command


def export_html(config: EngineConfig) -> str:
    """The block for `config`: per target, its name and version, the command(s), then what is not mapped."""
    parts = ['<details class="export"><summary>Run this configuration on vLLM / SGLang</summary>']
    for name in EXPORT_TARGETS:
        try:
            result = export_command(config, name)
        except EngineError as error:  # a configuration the export cannot name (say so, keep the panel up)
            message = f"{EXPORT_TARGETS[name].label}: {error}"
            parts.append(f'<div class="export-note">{html.escape(message)}</div>')
            continue
        spec = result.target
        parts.append(f'<div class="export-target">{html.escape(spec.label)} {html.escape(spec.version)}</div>')
        for command in result.commands:
            role = f"# {command.role}\n" if len(result.commands) > 1 else ""
            parts.append(f'<pre class="export-cmd">{html.escape(role + command.shell)}</pre>')
        if result.unmapped:
            items = "".join(f"<li><b>{html.escape(row.field)}={html.escape(repr(row.value))}</b>: "
                            f"{html.escape(row.note)}</li>" for row in result.unmapped)
            parts.append(f'<div class="export-unmapped">Not mapped:<ul>{items}</ul></div>')
        parts += [f'<div class="export-note">{html.escape(note)}</div>' for note in result.notes]
    parts.append('<div class="export-note">Also: <code>python -m engine.tools.export --target vllm|sglang</code>; '
                 'docs/export.md has the mapping.</div></details>')
    return "".join(parts)
