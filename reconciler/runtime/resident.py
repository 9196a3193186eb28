"""The resident helper: ``probe.py --serve``, one JSON request a line, one answer a line.

A module of its own beside the probe (one of ``AGENT_MODULES``): what it adds is
the conversation, and the list of watched names it keeps between requests, not a reading of the
machine. Standard library only: it runs on machines with whatever python3 they have.
"""

from __future__ import annotations

import bisect
import hashlib
import json


def serve(stdin, stdout, dispatch):
    """``--serve``: one JSON request a line on stdin, one JSON answer a line on stdout, until
    stdin closes (its SSH channel closed: the reconciler stopped or lost the connection). A
    long-lived reconciler keeps one per machine so that a probe costs no interpreter start.
    ``dispatch`` answers a request (the probe's: this module imports none of the others).

    The list of watched names comes with a reference (``names_ref``) and is kept: a request with only
    the kept list's reference reuses it; one with a change to it (``names_base``, ``names_add``,
    ``names_drop``) makes the list its reference names. Any other reference is an error: the
    reconciler then sends the list whole."""
    kept = (None, None)
    for line in stdin:
        if not line.strip():
            continue
        try:
            args = json.loads(line)
            ref = args.pop("names_ref", None) if isinstance(args, dict) else None
            if ref is not None and "names" in args:
                kept = (ref, args["names"])
            elif ref is not None:
                if "names_base" in args:
                    kept = _changed(kept, args, ref)
                if ref != kept[0]:
                    raise KeyError("names %s not kept" % ref)
                args["names"] = kept[1]
            answer = dispatch(args)
        except Exception as e:  # noqa: BLE001 - reported to the caller, the helper goes on
            answer = {"__error__": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


def _changed(kept, args, ref):
    """The kept list with the change ``args`` carry applied, checked against ``ref`` (see
    remote_agent.names_ref). The kept list is sorted (a change is only ever sent from a sorted
    list), so each name goes in or out in place; were it not, the check fails."""
    base, add, drop = args.pop("names_base"), args.pop("names_add", ()), args.pop("names_drop", ())
    if base != kept[0]:
        raise KeyError("names %s not kept" % base)
    names = list(kept[1])
    for name in drop:
        i = bisect.bisect_left(names, name)
        if i < len(names) and names[i] == name:
            del names[i]
    for name in add:
        i = bisect.bisect_left(names, name)
        if i == len(names) or names[i] != name:
            names.insert(i, name)
    data = json.dumps(names, separators=(",", ":")).encode()
    if hashlib.sha256(data).hexdigest()[:32] != ref:
        raise KeyError("names %s: the change does not give the list" % ref)
    return ref, names
