"""The models and the planner import nothing that reaches a network, a process or git.

Checked on the source (transitively, within the package), so a stray import fails here before it
makes the planner untestable from fixtures.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "reconciler"
PURE = ["reconciler.plan", "reconciler.observed", "reconciler.identity", "reconciler.boundary", "reconciler.display",
        "reconciler.exposure", "reconciler.spec.models",
        "reconciler.spec.resolve", "reconciler.spec.load", "reconciler.spec.checks", "reconciler.spec.yamlsafe"]
FORBIDDEN = {"fabric", "paramiko", "git", "subprocess", "socket", "http", "urllib", "requests", "watchfiles",
             "swift", "torch"}


def _module_file(mod: str) -> Path:
    rel = Path(*mod.split(".")[1:])
    if not rel.parts:  # the package itself ("from . import x" at its top)
        return PKG / "__init__.py"
    f = PKG / rel.with_suffix(".py")
    return f if f.exists() else PKG / rel / "__init__.py"


def _imports(mod: str) -> set[str]:
    tree = ast.parse(_module_file(mod).read_text())
    out = set()
    pkg_parts = mod.split(".")
    is_pkg = _module_file(mod).name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
                out.add(name)
                for a in node.names:  # "from . import x" may name a module
                    if _module_file(f"{name}.{a.name}").exists() if name.startswith("reconciler") else False:
                        out.add(f"{name}.{a.name}")
            else:
                out.add(node.module)
    return out


def _closure(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for imp in _imports(m):
            if imp.startswith("reconciler") and _module_file(imp).exists():
                todo.append(imp)
            else:
                seen.add(imp)
    return seen


@pytest.mark.parametrize("mod", PURE)
def test_pure_modules_do_not_reach_the_world(mod):
    bad = sorted(m for m in _closure(mod) if m.split(".")[0] in FORBIDDEN)
    assert not bad, f"{mod} imports {bad} (directly or through the package)"


def test_the_check_sees_imports():
    assert "subprocess" in _closure("reconciler.backends.local") or "reconciler.runtime.probe" in _closure(
        "reconciler.backends.local")
    assert "git" in _closure("reconciler.gitops")
