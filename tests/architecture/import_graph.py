"""The import graph of the project's packages, read from the source (nothing is imported or run).

Every `import` and `from ... import` statement counts, wherever it stands: at the top, inside a
function (a lazy import still ties two modules together) or under `if TYPE_CHECKING:` (a type that
points back up is still a circle a reader has to untangle). An edge goes to the module a statement
names; `from package import name` goes to the submodule when `name` is one. Implicit parent-package
imports (importing `engine.core.request` runs `engine/__init__.py` first) are not edges.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One import statement: who imports, the module it names, the names it takes, and where it stands."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(root: Path, places: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `places` (folders or single files, relative to `root`), by dotted name."""
    paths = [root / place for place in places if (root / place).is_file()]
    paths += [path for place in places if (root / place).is_dir() for path in sorted((root / place).rglob("*.py"))]
    return {module_name(path, root): path for path in paths}


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(root: Path, places: tuple[str, ...]) -> list[Import]:
    """Every import statement in the modules of `places`."""
    modules = modules_of(root, places)
    found = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [Import(source, alias.name, (), node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(node, source, path.name == "__init__.py")
                submodules = [alias.name for alias in node.names if f"{target}.{alias.name}" in modules]
                names = tuple(alias.name for alias in node.names if alias.name not in submodules)
                found += [Import(source, f"{target}.{name}", (), node.lineno) for name in submodules]
                if names or not submodules:
                    found.append(Import(source, target, names, node.lineno))
    return found


def graph(imports: list[Import], modules: set[str]) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    edges: dict[str, set[str]] = {module: set() for module in modules}
    for item in imports:
        if item.target in modules and item.target != item.source:
            edges[item.source].add(item.target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted by first member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)
