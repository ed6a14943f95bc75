"""The architecture's fitness test: the import rules the layout promises, checked on the source.

- No import circle anywhere in `engine/` or `playground/` (lazy and TYPE_CHECKING imports count).
- `engine/` never imports `playground/`: the engine is usable without the UI.
- The playground (and `app.py`) imports from the engine only the names `engine/__init__.py` exports.
- `engine/training/` (the program that builds the demo pair) never imports the serving engine.
The checker itself is tested on a scratch tree, so that a clean result means something.
"""

from __future__ import annotations

import ast

from tests.architecture.import_graph import circles, graph, imports_of, modules_of
from tests.support.paths import PROJECT_ROOT

PACKAGES = ("engine", "playground")


def _engine_public_names() -> set[str]:
    tree = ast.parse((PROJECT_ROOT / "engine" / "__init__.py").read_text(encoding="utf-8"))
    exported = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(target, "id", None) == "__all__" for target in node.targets))
    return set(ast.literal_eval(exported))


def _describe(circle: list[str], imports) -> str:
    members = set(circle)
    ties = sorted({f"{i.source} -> {i.target} (line {i.line})" for i in imports
                   if i.source in members and i.target in members})
    return " / ".join(circle) + ": " + "; ".join(ties)


def test_no_import_circle_in_the_engine_or_the_playground():
    imports = imports_of(PROJECT_ROOT, PACKAGES)
    found = circles(graph(imports, set(modules_of(PROJECT_ROOT, PACKAGES))))
    assert not found, "import circles:\n" + "\n".join(_describe(circle, imports) for circle in found)


def test_the_engine_never_imports_the_playground():
    wrong = [f"{i.source} line {i.line}: {i.target}" for i in imports_of(PROJECT_ROOT, ("engine",))
             if i.target == "playground" or i.target.startswith("playground.")]
    assert not wrong, wrong


def test_the_playground_uses_only_the_engines_public_names():
    public = _engine_public_names()
    imports = imports_of(PROJECT_ROOT, ("playground", "app.py"))
    wrong = []
    for item in imports:
        if item.target != "engine" and not item.target.startswith("engine."):
            continue
        if item.target != "engine":
            wrong.append(f"{item.source} line {item.line}: imports {item.target} (only `from engine import ...`)")
        else:
            wrong += [f"{item.source} line {item.line}: {name} is not exported by engine/__init__.py"
                      for name in item.names if name not in public]
    assert not wrong, "\n".join(wrong)


def test_the_training_program_never_imports_the_serving_engine():
    wrong = [f"{i.source} line {i.line}: {i.target}" for i in imports_of(PROJECT_ROOT, ("engine/training",))
             if i.target.split(".")[0] == "engine" and not i.target.startswith("engine.training")]
    assert not wrong, wrong


def test_the_checker_finds_circles_lazy_and_type_only_imports_included(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
                                  "def g():\n    return 1\n")
    (package / "c.py").write_text("from . import b\n")
    imports = imports_of(tmp_path, ("pkg",))
    assert circles(graph(imports, set(modules_of(tmp_path, ("pkg",))))) == [["pkg.a", "pkg.b"]]
    (package / "b.py").write_text("def g():\n    return 1\n")
    assert circles(graph(imports_of(tmp_path, ("pkg",)), set(modules_of(tmp_path, ("pkg",))))) == []
