"""No function of the planner is longer than MAX_LINES: long functions are split into named steps.

A function's length counts from its ``def`` line to its last line (``end_lineno``), decorators excluded;
methods and nested functions are checked too, each named by its qualified name.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optimizer", "formulations")
MAX_LINES = 80


def long_functions(source: str, module: str, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """(``module:qualified.name``, lines) of every function in `source` longer than `max_lines`."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > max_lines:
                        out.append((f"{module}:{name}", lines))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_function_over_max_lines():
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found += long_functions(path.read_text(encoding="utf-8"), _module(path))
    over = [f"{name}:{lines}" for name, lines in found]
    assert not over, f"functions longer than {MAX_LINES} lines (split them): " + ", ".join(over)


def test_checker_flags_planted_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    planted = "@decorator\ndef planted():\n" + body + "    return 0\n"  # def line + 80 = 81 lines
    assert long_functions(planted, "m") == [("m:planted", 81)]
    shorter = "def fits():\n" + body + "\n"
    assert long_functions(shorter, "m") == []
    nested = (
        "class C:\n    def f(self):\n"
        + "".join(f"    {line}" for line in body.splitlines(True))
        + "        return 0\n"
    )
    assert long_functions(nested, "m") == [("m:C.f", 81)]
