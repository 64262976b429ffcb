"""The package layers: no import cycle between modules (imports inside functions count too), and the
formulations import only the lower layer of `optimizer` (schema, model, layout, space, objective, errors):
extraction, verification, plans and reports live above them, in `optimizer`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optimizer", "formulations")
# what the formulations may read from optimizer: the problem, the physics, legality, the space, the score
LOWER = ("optimizer.schema", "optimizer.model", "optimizer.layout", "optimizer.space", "optimizer.objective",
         "optimizer.errors")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    mods = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for top in ast.walk(tree) if isinstance(top, ast.If) and _is_type_checking(top.test)
                       for n in ast.walk(top)}
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


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    g = import_graph()
    g["optimizer.layout"] = g["optimizer.layout"] | {"optimizer.solve"}
    assert any("optimizer.layout" in c for c in cycles(g))


def test_formulations_import_only_the_lower_layer():
    bad = {(m, d) for m, deps in import_graph().items() if m.startswith("formulations")
           for d in deps if d.startswith("optimizer") and not d.startswith(LOWER)}
    assert bad == set()
