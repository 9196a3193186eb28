"""The models and the planner import nothing that reaches a network, a process or git.

Checked on the source (transitively, within the package), so a stray import fails here before it
makes the planner untestable from fixtures. Also: no module reads a test switch from its
environment (faults for the tests are injected from tests/, not configured in the product).
"""

from __future__ import annotations

import ast
import functools
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


# ---------------------------------------------------------------- what the product reads from its environment

ENVIRON_METHODS = {"get", "pop", "setdefault"}


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


@functools.cache
def _constants(path: Path, depth: int = 0) -> dict[str, str]:
    """A module's top-level string constants: its own, those it imports by name from the package,
    and aliases of either (``A = B``)."""
    tree = ast.parse(path.read_text())
    mod = _module_name(path)
    pkg_parts = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: dict[str, str] = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.level and depth < 5:
            base = ".".join(pkg_parts[: len(pkg_parts) - n.level + 1] + ([n.module] if n.module else []))
            f = _module_file(base)
            if f.exists():
                theirs = _constants(f, depth + 1)
                out.update({a.asname or a.name: theirs[a.name] for a in n.names if a.name in theirs})
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = [t for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
            if isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
                value = n.value.value
            elif isinstance(n.value, ast.Name) and n.value.id in out:
                value = out[n.value.id]
            else:
                continue
            out.update({t.id: value for t in targets})
    return out


def _env_names(path: Path) -> set[str]:
    """The names of the environment variables a module reads, as far as its source spells them: a
    string, a string constant (see ``_constants``), or the fixed parts of an f-string ("PREFIX_{}")."""
    tree = ast.parse(path.read_text())
    constants = _constants(path)

    def name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return None

    keys: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ENVIRON_METHODS and _is_environ(f.value):
                keys.append(node.args[0])
            elif (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "getenv":
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            keys.append(node.slice)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and _is_environ(node.comparators[0]):
            keys.append(node.left)
    return {n for n in map(name, keys) if n is not None}


def test_the_product_reads_no_test_switch_from_its_environment():
    """Faults for the crash-safety tests are injected from tests/ (tests/faults.py replaces the
    product's no-op seams); a variable that changes the product's behaviour under test would be one
    a production host could set by mistake."""
    from reconciler.config import Config

    read = {str(p.relative_to(PKG.parent)): _env_names(p) for p in sorted(PKG.rglob("*.py"))}
    bad = {f: sorted(n for n in names if "TEST" in n.upper()) for f, names in read.items()}
    bad = {f: names for f, names in bad.items() if names}
    assert not bad, f"read from the environment: {bad}"
    # config.py reads RECONCILER_<SETTING> for every setting.
    assert not [f for f in Config.model_fields if "TEST" in f.upper()]


def test_the_check_sees_environment_reads():
    assert {"JOURNAL_STREAM", "RECONCILER_LOG_LEVEL"} <= _env_names(PKG / "daemon.py")
    assert "_ARGCOMPLETE" in _env_names(PKG / "cli.py")
    assert "RECONCILER_{}" in _env_names(PKG / "config.py")
    # A constant imported by name from another module of the package is followed.
    assert _constants(PKG / "apply.py")["LOCAL"] == "local"

