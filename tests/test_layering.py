"""The architecture, checked on the source: layers, rooms that stay apart, no cycles, a pure planner.

docs/architecture.md draws the layers; ``LAYERS`` below is the same table, lowest first. A module
may import its own room and any room of a lower layer; rooms on one layer never import each other.
Imports are read from the source, including those inside functions, so a lazy import cannot hide
an upward dependency. Also: the planner and the models reach no network, process or git, and no
module reads a test switch from its environment (faults for the tests are injected from tests/).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "reconciler"

# Lowest first. The package root (``reconciler/__init__.py``: the version) sits with core.
LAYERS: list[tuple[str, ...]] = [
    ("runtime",),             # files shipped to machines: standard library only, imports nothing of ours
    ("core",),                # values everyone shares
    ("tasks",),               # task plugins: a typed task to a bundle's entrypoint
    ("spec",),                # the desired-state objects, their checks, offers
    ("planner", "status"),    # a pure plan | the status files and the ledger
    ("artifacts", "gitops"),  # bundles, transfers, provenance | git as the durable state
    ("rentals",),             # providers and rented machines
    ("machines",),            # transports and launch modes
    ("engine",),              # observe, apply, the pass
    ("daemon", "agent"),      # the long-running service | the in-house machine's outbound agent
    ("cli",),                 # the command line
]
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
RANK["<root>"] = RANK["core"]
PURE = ["reconciler.planner", "reconciler.spec", "reconciler.core.observed", "reconciler.core.identity",
        "reconciler.core.boundary", "reconciler.core.display", "reconciler.core.runstatus"]
FORBIDDEN = {"fabric", "paramiko", "git", "subprocess", "socket", "http", "urllib", "requests", "watchfiles",
             "swift", "torch"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _module_file(mod: str) -> Path:
    return MODULES.get(mod, PKG / "-missing-")


def _room(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1 or (len(parts) == 2 and mod in MODULES and MODULES[mod].parent == PKG):
        return "<root>"
    return parts[1]


@functools.cache
def _imports(mod: str) -> frozenset[str]:
    """What a module imports, anywhere in its body: modules of the package by their full name (a
    name imported from a package counts as the module when it is one), others by their top name."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            if base in MODULES or not base.startswith("reconciler"):
                out.add(base)
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    out.add(f"{base}.{a.name}")
    return frozenset(out)


def _ours(mod: str) -> set[str]:
    return {m for m in _imports(mod) if m in MODULES}


def _closure(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for imp in _imports(m):
            if imp in MODULES:
                todo.append(imp)
            else:
                seen.add(imp)
    return seen


def test_every_room_is_in_the_table():
    rooms = {_room(m) for m in MODULES}
    assert rooms - {"<root>", "__main__"} <= set(RANK), f"rooms not in LAYERS: {rooms - set(RANK)}"
    assert set(RANK) - {"<root>"} <= rooms, "LAYERS names a room that does not exist"


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if not m.endswith("__main__")))
def test_no_module_imports_a_higher_layer_or_a_sibling(mod):
    mine = _room(mod)
    bad = []
    for imp in sorted(_ours(mod)):
        theirs = _room(imp)
        if theirs == mine:
            continue
        if RANK[theirs] > RANK[mine]:
            bad.append(f"{imp} (layer {RANK[theirs]} above {mine}'s {RANK[mine]})")
        elif RANK[theirs] == RANK[mine]:
            bad.append(f"{imp} (sibling room {theirs} on {mine}'s layer)")
    assert not bad, f"{mod} imports {bad}"


def test_runtime_imports_nothing_of_the_package():
    """Its files run on machines with only a python: nothing of the control plane travels there (the
    agent's modules import one another, and the SSH transport ships them together)."""
    bad = {m: sorted(i for i in _imports(m) if i.startswith("reconciler") and _room(i) != "runtime")
           for m in MODULES if _room(m) == "runtime"}
    assert not {m: v for m, v in bad.items() if v}


def test_no_import_cycles():
    """Between modules (imports inside functions included): a cycle makes every member of it a
    dependency of every other, and the layers stop meaning anything."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in _ours(v):
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
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    # A package's __init__ importing its own modules (a registry) is not a cycle of design.
    cycles = [c for c in cycles if not all(x == c[0] or x.startswith(c[0] + ".") for x in c)]
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("mod", PURE)
def test_pure_modules_do_not_reach_the_world(mod):
    targets = [m for m in MODULES if m == mod or m.startswith(mod + ".")]
    bad = sorted({m for t in targets for m in _closure(t) if m.split(".")[0] in FORBIDDEN})
    assert not bad, f"{mod} imports {bad} (directly or through the package)"


def test_the_checks_see_imports():
    assert "subprocess" in _closure("reconciler.machines.local")
    assert "subprocess" in _closure("reconciler.gitops.repo")
    # an import inside a function counts
    assert "reconciler.rentals.inventory" in _ours("reconciler.machines.pool")
    assert _room("reconciler.planner.plan") == "planner" and _room("reconciler") == "<root>"


# ---------------------------------------------------------------- what the product reads from its environment

ENVIRON_METHODS = {"get", "pop", "setdefault"}


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


@functools.cache
def _constants(path: Path, depth: int = 0) -> dict[str, str]:
    """A module's top-level string constants: its own, those it imports by name from the package,
    and aliases of either (``A = B``)."""
    tree = ast.parse(path.read_text())
    mod = _module_name(path)
    pkg_parts = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out: dict[str, str] = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and depth < 5 and (n.level or (n.module or "").startswith("reconciler")):
            base = ".".join(pkg_parts[: len(pkg_parts) - n.level + 1] + ([n.module] if n.module else [])) \
                if n.level else n.module
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
    from reconciler.core.config import Config

    read = {str(p.relative_to(PKG.parent)): _env_names(p) for p in sorted(PKG.rglob("*.py"))}
    bad = {f: sorted(n for n in names if "TEST" in n.upper()) for f, names in read.items()}
    bad = {f: names for f, names in bad.items() if names}
    assert not bad, f"read from the environment: {bad}"
    # config.py reads RECONCILER_<SETTING> for every setting.
    assert not [f for f in Config.model_fields if "TEST" in f.upper()]


def test_the_check_sees_environment_reads():
    assert {"JOURNAL_STREAM", "RECONCILER_LOG_LEVEL"} <= _env_names(PKG / "daemon" / "logs.py")
    assert "_ARGCOMPLETE" in _env_names(PKG / "cli" / "main.py")
    assert "RECONCILER_{}" in _env_names(PKG / "core" / "config.py")
    # A constant imported by name from another module of the package is followed.
    assert _constants(PKG / "engine" / "apply.py")["LOCAL"] == "local"

