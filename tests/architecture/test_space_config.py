"""The Space's install path is the README's: the front matter names the SDK, its version and Python, and a GPU Space
needs nothing beyond requirements.txt (docs/hosting.md, "Which Space hardware"); the Space's Python and torch are
checked against the versions ZeroGPU supports, as docs/hosting.md states them (its "ZeroGPU" section)."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import PROJECT_ROOT


def front_matter() -> dict:
    text = (PROJECT_ROOT / "README.md").read_text()
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "the README has no YAML front matter"
    return yaml.safe_load(match.group(1))


def pins() -> dict[str, str]:
    lines = (PROJECT_ROOT / "requirements.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_front_matter_names_the_pinned_gradio_and_the_projects_python():
    space, pinned = front_matter(), pins()
    assert space["sdk"] == "gradio" and space["app_file"] == "app.py"
    assert str(space["sdk_version"]) == pinned["gradio"], "the Space would run another Gradio than the one pinned"
    requires = re.search(r'requires-python\s*=\s*">=\s*([\d.]+)"', (PROJECT_ROOT / "pyproject.toml").read_text())
    assert requires and tuple(map(int, str(space["python_version"]).split("."))) >= tuple(
        map(int, requires.group(1).split(".")))
    assert space["suggested_hardware"] in ("l4x1", "t4-small", "a10g-small", "cpu-basic")


def test_a_gpu_space_needs_nothing_beyond_requirements_txt():
    pinned = pins()
    assert pinned["torch"] == "2.13.0"  # the CUDA wheel on a Space, the CPU wheel here
    assert not {"flash-attn", "flash_attn", "llama-cpp-python", "llama_cpp_python"} & set(pinned), \
        "a package that compiles for minutes or hours is in the Space's install"
    for extra in ("packages.txt", "pre-requirements.txt"):
        assert not (PROJECT_ROOT / extra).exists(), f"{extra}: a Space would install more than the README says"


def zero_gpu_versions() -> dict[str, tuple[list[str], str, str]]:
    """docs/hosting.md's table: name -> (versions ZeroGPU supports, this Space's, whether it is supported)."""
    text = (PROJECT_ROOT / "docs" / "hosting.md").read_text()
    table = re.search(r"<!-- zerogpu-versions -->\n(.*?)<!-- /zerogpu-versions -->", text, re.S)
    assert table, "docs/hosting.md has no ZeroGPU versions table"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.group(1).splitlines()[2:]]
    return {name: ([v.strip() for v in supported.split(",")], ours, verdict) for name, supported, ours, verdict in rows}


def test_the_zero_gpu_versions_table_states_this_spaces_python_and_torch_and_whether_zero_gpu_lists_them():
    table, space = zero_gpu_versions(), front_matter()
    assert set(table) == {"Python", "torch"}
    assert table["Python"][1] == str(space["python_version"]), "the table's Python is not the front matter's"
    assert table["torch"][1] == pins()["torch"], "the table's torch is not requirements.txt's"
    for name, (supported, ours, verdict) in table.items():
        listed = any(version == ours or version.startswith(ours + ".") for version in supported)
        assert verdict == ("yes" if listed else "no"), f"{name} {ours}: the table says {verdict!r}"
    comment = (PROJECT_ROOT / "README.md").read_text().split("\n---\n")[0]
    assert "ZeroGPU" in comment and table["torch"][1] in comment, "the front matter does not say the versions"
