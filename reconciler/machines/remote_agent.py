"""The machine agent as one program for ``python3``: the runtime's agent modules and their loader.

The agent is several modules (``runtime/probe.py`` and the siblings it imports), yet observing a
machine must stay one round trip and leave nothing on it but the one staged file it always had.
So the SSH transport sends one program: each module's source as a string (in ``AGENT_MODULES``'
order, each after those it imports) and a few lines that make them modules from those strings (no
temporary files), then run the probe's entry point. The local transport imports the same modules
normally.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from reconciler.runtime import AGENT_MODULES
from reconciler.runtime import probe as agent_module

# argv words beyond this size are embedded into the agent program instead (MAX_ARG_STRLEN is 128 KiB).
ARGV_LIMIT = 64 * 1024
STAGED_DIR = "$HOME/.cache/reconciler"  # where a machine keeps its copy (expanded by its shell)
_LOADER = '''

def _load():
    """The agent's modules, made from their sources above as one package, so that their relative
    imports find one another; nothing is written to the machine."""
    import types

    package = types.ModuleType(PACKAGE)
    package.__path__ = []
    sys.modules[PACKAGE] = package
    for name, source in SOURCES.items():
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__package__ = PACKAGE
        sys.modules[module.__name__] = module
        exec(compile(source, name + ".py", "exec"), module.__dict__)
    return sys.modules[f"{PACKAGE}.probe"]


main = _load().main
'''
_MAIN = "sys.exit(main(sys.argv))\n"
_AGENT_SOURCE: str | None = None
_AGENT_HASH: str | None = None


def agent_source() -> str:
    global _AGENT_SOURCE
    if _AGENT_SOURCE is None:
        here = Path(agent_module.__file__).parent
        sources = {name: (here / f"{name}.py").read_text(encoding="utf-8") for name in AGENT_MODULES}
        _AGENT_SOURCE = ("import sys\n\nPACKAGE = \"reconciler_agent\"\nSOURCES = {\n"
                         + "".join(f"    {name!r}: {text!r},\n" for name, text in sources.items())
                         + "}\n" + _LOADER + _MAIN)
    return _AGENT_SOURCE


def agent_hash() -> str:
    global _AGENT_HASH
    if _AGENT_HASH is None:
        import hashlib

        _AGENT_HASH = hashlib.sha256(agent_source().encode()).hexdigest()[:16]
    return _AGENT_HASH


def staged_path() -> str:
    """Where a machine keeps its copy of this version of the agent (shell words)."""
    return f"{STAGED_DIR}/agent-{agent_hash()}.py"


def agent_program(args: dict) -> tuple[str, list[str]]:
    """The program for ``python3 -`` and its argv: arguments as argv, or embedded when large."""
    text = json.dumps(args, separators=(",", ":"), sort_keys=True)
    source = agent_source()
    if len(text) <= ARGV_LIMIT:
        return source, [text]
    head, sep, _ = source.rpartition(_MAIN)
    if not sep:
        raise RuntimeError("the agent program lost its entry point")
    return head + f"sys.exit(main(['-', {text!r}]))\n", []


# The last lists of watched names encoded, newest last: (the list, its JSON, its reference, whether
# its names are sorted and unique). The observer hands every machine of a pass the same list
# object, so it is encoded once a pass, not once a machine; the few before it stay, so that a
# helper that holds one of them is sent the change.
_names: tuple = ()
KEPT_LISTS = 4
_deltas: dict = {}  # (reference held, reference sent) → the change's JSON fields, for the latest list
_delta_lock = threading.Lock()


def names_ref(data: bytes) -> str:
    """The reference of a list of names: of its JSON (sorted, unique names, compact), so that a
    helper that rebuilds the list from a change can check it holds the very same list."""
    return hashlib.sha256(data).hexdigest()[:32]


def _encoded_names(names: list) -> tuple[bytes, str]:
    global _names, _deltas
    lists = _names  # read once: another thread may replace it meanwhile
    if not lists or lists[-1][0] is not names:
        data = json.dumps(names, separators=(",", ":")).encode()
        # A change is sent only between lists of sorted, unique names: what the helper rebuilds.
        canonical = all(a < b for a, b in zip(names, names[1:]))
        lists = _names = (*lists[-(KEPT_LISTS - 1):], (names, data, names_ref(data), canonical))
        _deltas = {}
    return lists[-1][1], lists[-1][2]


def _delta(known: str, ref: str, size: int) -> bytes | None:
    """The change from the list ``known`` names to the latest (``ref``) as JSON fields, when the
    list ``known`` names is still kept here and the change is smaller than the list itself."""
    cached = _deltas.get((known, ref))
    if cached is None:
        with _delta_lock:  # once for all the machines of a pass (32 threads would compute it at once)
            cached = _deltas.get((known, ref))
            if cached is None:
                cached = _deltas[(known, ref)] = _change(known, ref, size)
    return cached or None


def _change(known: str, ref: str, size: int) -> bytes:
    lists = _names
    old = next((entry for entry in lists if entry[2] == known), None)
    if old is None or lists[-1][2] != ref or not (old[3] and lists[-1][3]):
        return b""
    before, after = set(old[0]), set(lists[-1][0])
    fields = json.dumps({"names_add": sorted(after - before), "names_base": known,
                         "names_drop": sorted(before - after)}, separators=(",", ":")).encode()[1:-1]
    return fields if len(fields) < size else b""


def resident_request(args: dict, known: str | None) -> tuple[bytes, str | None]:
    """A request line for the resident helper (``probe.py --serve``), and the reference of the
    names it carries. The helper keeps the last list of names it was sent under its reference:
    when ``known`` (what this helper was last sent) is that reference, only the reference goes;
    when it is a list kept here, only the change (names added and dropped; the helper checks the
    list it rebuilds against the reference). At 10,000 watched names a list is ~280 KB of JSON
    and 1.4 ms to encode; a fleet of 1,000 machines was sent it whole on every pass, and then on
    every pass that started or settled a run."""
    names = args.get("names")
    if not isinstance(names, list):
        return json.dumps(args, separators=(",", ":"), sort_keys=True).encode() + b"\n", None
    data, ref = _encoded_names(names)
    head = json.dumps({**{k: v for k, v in args.items() if k != "names"}, "names_ref": ref},
                      separators=(",", ":"), sort_keys=True).encode()
    if ref == known:
        return head + b"\n", ref
    change = _delta(known, ref, len(data)) if known is not None else None
    if change is not None:
        return head[:-1] + b"," + change + b"}\n", ref
    return head[:-1] + b',"names":' + data + b"}\n", ref


__all__ = ["ARGV_LIMIT", "STAGED_DIR", "agent_hash", "agent_program", "agent_source", "resident_request",
           "staged_path"]
