#!/usr/bin/env python3
"""An example of the `command` provider contract (docs/rentals.md), usable as a template.

    command_provider.py provision        stdin {"name": ..., "offer": {...}}; prints the rental
    command_provider.py list             prints every rental of the account as a JSON list
    command_provider.py terminate ID     gives the rental back (and succeeds if it is gone)

A real one would call its provider's API here (with the key from the environment variable named
by the Provider's `credentials`). This one hands the work to the reconciler's local provider, so
that it runs on any machine with sshd: its rentals are sshd servers on loopback, kept in
$COMMAND_PROVIDER_STATE (default ~/.reconciler/command-provider); both settings come from the
Provider's command.env.
"""

import json
import os
import sys

from reconciler.rentals.providers.local import LocalAdapter
from reconciler.spec.models.provider import Offer, Provider

STATE = os.environ.get("COMMAND_PROVIDER_STATE", os.path.expanduser("~/.reconciler/command-provider"))
# The rentals' ssh key: a path, set in the Provider's command.env (the executables see no other
# variable of the reconciler host but the base environment and the provider's credential).
IDENTITY = os.environ.get("COMMAND_PROVIDER_IDENTITY_FILE") or os.environ.get("COMMAND_PROVIDER_KEY")
TEMPFAIL = 75  # "try again later"


def adapter(offers=()):
    doc = {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "command-example"},
           "spec": {"type": "local", "offers": list(offers) or [{"id": "any", "price_per_hour": 0}],
                    "local": {"stateDir": STATE},
                    "ssh": {"identity_file": IDENTITY} if IDENTITY else {}}}
    return LocalAdapter(Provider.model_validate(doc), None)


def as_json(r):
    return {"id": r.id, "name": r.name, "state": r.state, "host": r.host, "port": r.port, "user": r.user,
            "price_per_hour": r.price_per_hour, "created_at": r.created_at, "offer": r.offer, "message": r.message}


def main(argv):
    if argv[:1] == ["provision"]:
        req = json.load(sys.stdin)
        offer = Offer.model_validate(req["offer"])
        print(json.dumps(as_json(adapter([req["offer"]]).provision(req["name"], offer))))
    elif argv[:1] == ["list"]:
        print(json.dumps([as_json(r) for r in adapter().inventory()]))
    elif argv[:1] == ["terminate"] and len(argv) == 2:
        adapter().terminate(argv[1])
    else:
        print("usage: command_provider.py provision|list|terminate ID", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as e:  # the machine could not be started: worth another try later
        print(f"command_provider: {e}", file=sys.stderr)
        sys.exit(TEMPFAIL)
