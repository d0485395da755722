"""DESIGN.md "Layers": imports point down only (app -> trainers -> envs -> core)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "core": {"core"},
    "envs": {"envs", "core.types"},
    "trainers": {"trainers", "envs", "core"},
    "app": {"app", "trainers", "envs", "core"},
}
FLOORS = set(ALLOWED)


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def allowed(floor: str, module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED[floor])


def test_imports_point_down_only():
    bad = []
    for floor in FLOORS:
        for py in (ROOT / floor).rglob("*.py"):
            for mod in imports(py):
                if mod.split(".")[0] in FLOORS and not allowed(floor, mod):
                    bad.append(f"{py.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)
