"""The package layers: no import cycle between modules (imports inside functions count too), and each stage
imports only the stages below it (`RANKS`, lowest first; `if TYPE_CHECKING:` imports, for annotations, do
not count). The formulations sit above the physics and the space and below the drivers that extract,
verify and report their plans."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optimizer", "formulations")
# the stages, lowest first: a module may import its own rank and the ranks below it
RANKS = (
    ("optimizer.errors", "optimizer.progress"),
    ("optimizer.schema",),
    ("optimizer.rules",),
    ("optimizer.model",),
    ("optimizer.prepare",),
    ("formulations",),
    ("optimizer.io",),
    ("optimizer.report",),
    ("optimizer.drivers",),
    ("optimizer.api",),
    ("optimizer.cli",),
)


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph() -> dict[str, set[str]]:
    mods = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for top in ast.walk(tree)
            if isinstance(top, ast.If) and _is_type_checking(top.test)
            for n in ast.walk(top)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue  # `if TYPE_CHECKING:` imports are for annotations, not run
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    head = base[: len(base) - node.level + 1]
                    target = ".".join(head + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod and not (n in PACKAGES and mod.startswith(n + ".")):
                    graph[mod].add(n)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def rank(module: str) -> int | None:
    """The stage rank of a module (None: the package roots `optimizer` and `formulations` themselves)."""
    for i, prefixes in enumerate(RANKS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, imported) pairs where a module imports a stage above its own."""
    return {
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if rank(m) is not None and rank(d) is not None and rank(d) > rank(m)
    }


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    g = import_graph()
    g["optimizer.rules.layout"] = g["optimizer.rules.layout"] | {"optimizer.drivers.solve"}
    assert any("optimizer.rules.layout" in c for c in cycles(g))


def test_every_module_has_a_rank():
    assert {m for m in import_graph() if rank(m) is None} == {"optimizer"}


def test_stages_import_only_the_stages_below():
    assert upward_imports(import_graph()) == set()


def test_an_upward_import_is_found():
    g = import_graph()
    g["optimizer.model.step"] = g["optimizer.model.step"] | {"optimizer.drivers.solve"}
    assert ("optimizer.model.step", "optimizer.drivers.solve") in upward_imports(g)
