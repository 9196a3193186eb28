"""The command provider: any rental provider, through three executables of the team's own.

``provision`` reads ``{"name": ..., "offer": {...}}`` as JSON on stdin and prints the rental;
``inventory`` prints every rental of the account as a JSON list; ``terminate`` gets the rental id
as its last argument. A rental is ``{"id", "name", "state", "host", "port", "user",
"price_per_hour", "created_at", "offer", "message"}`` (state: provisioning, running, failed,
terminating or terminated; created_at: unix time or ISO 8601). Exit 75 (EX_TEMPFAIL) means
"try again later"; any other non-zero exit is a permanent error, with stderr as its message.
The executables run with the base environment of procenv (PATH, HOME, locale, ...), the plain
settings of ``command.env`` and the provider's own secret, named by spec.credentials; no other
variable of the reconciler host.
"""

from __future__ import annotations

import json
import subprocess

from reconciler.core import procenv
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.models.provider import Offer, Provider
from reconciler.core.runstatus import parse_iso
from .base import AdapterContext, Rental

TEMPFAIL = 75
STATES = ("provisioning", "running", "failed", "terminating", "terminated")


def make(provider: Provider, ctx: AdapterContext) -> "CommandAdapter":
    return CommandAdapter(provider, ctx)


class CommandAdapter:
    def __init__(self, provider: Provider, ctx: AdapterContext):
        self.provider, self.ctx = provider, ctx
        self.settings = provider.spec.command
        self.calls = 0

    def offers(self) -> list[Offer]:
        return list(self.provider.spec.offers)

    def provision(self, name: str, offer: Offer) -> Rental:
        out = self._run(self.settings.provision, json.dumps({"name": name, "offer": offer.model_dump(mode="json")}))
        return self._rental(out, "provision")

    def inventory(self) -> list[Rental]:
        out = self._run(self.settings.inventory, "")
        if not isinstance(out, list):
            raise TemporaryError(f"provider {self.provider.metadata.name}: inventory printed {type(out).__name__}, "
                                 "not a JSON list")
        return [self._rental(item, "inventory") for item in out]

    def terminate(self, rental_id: str) -> None:
        self._run(self.settings.terminate + [rental_id], "", parse=False)

    def _run(self, argv: list[str], stdin: str, parse: bool = True):
        self.calls += 1
        # The base allowlist and this provider's own credential, nothing else of this process: the
        # executable is the team's code, and must not see other providers' keys or runs' secrets.
        env = procenv.base(self.settings.env)
        if self.provider.spec.credentials:
            value = self.ctx.secret_source(self.provider.spec.credentials)
            if value:
                env[self.provider.spec.credentials] = value
        name = self.provider.metadata.name
        try:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=self.ctx.repo, env=env,
                               timeout=self.settings.timeoutSeconds)
        except FileNotFoundError:
            raise PermanentError(f"provider {name}: {argv[0]} not found") from None
        except PermissionError:
            raise PermanentError(f"provider {name}: {argv[0]} is not executable") from None
        except subprocess.TimeoutExpired:
            raise TemporaryError(f"provider {name}: {argv[0]} took longer than {self.settings.timeoutSeconds:g}s") from None
        if r.returncode != 0:
            why = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[-1][:300]
            cls = TemporaryError if r.returncode == TEMPFAIL else PermanentError
            raise cls(f"provider {name}: {argv[0]}: {why}")
        if not parse:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            raise TemporaryError(f"provider {name}: {argv[0]} did not print JSON") from None

    def _rental(self, item, what: str) -> Rental:
        name = self.provider.metadata.name
        if not isinstance(item, dict) or not isinstance(item.get("id"), (str, int)) or not isinstance(item.get("name"), str):
            raise TemporaryError(f"provider {name}: {what} printed a rental without id and name: {str(item)[:200]}")
        state = item.get("state")
        created = item.get("created_at")
        if isinstance(created, str):
            created = parse_iso(created)
        port = item.get("port")
        return Rental(id=str(item["id"]), name=item["name"], state=state if state in STATES else "provisioning",
                      host=item.get("host"), port=int(port) if isinstance(port, (int, str)) and str(port).isdigit() else None,
                      user=item.get("user"), price_per_hour=item.get("price_per_hour"),
                      created_at=float(created) if isinstance(created, (int, float)) else None,
                      offer=item.get("offer"), message=str(item.get("message") or ""))
