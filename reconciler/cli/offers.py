"""``reconcile offers``: what the repository's providers rent out now, in one table to compare.

Each provider with a market is asked for its live offers (the same read-only listing a pass
makes: Targon ``/inventory``, Lambda ``/instance-types``, RunPod ``/v2/catalog/gpus``, Vast.ai
``/bundles/``); local and command providers show their catalog. Credentials come from the
reconciler host's environment, as the engine resolves them, and are never printed. A provider
that cannot be listed is one line on stderr and the exit code 1; the others still print.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from reconciler.core.errors import ReconcilerError, UsageError

COLUMNS = ("PROVIDER", "GPU", "COUNT", "GPU MEM", "CPUS", "RAM", "REGION", "PRICE/H", "SPOT", "AVAILABLE")


def build(p: argparse.ArgumentParser, add_globals) -> None:
    p.add_argument("--provider", metavar="NAME", help="one provider (default: every provider in specs/)")
    p.add_argument("--gpu", metavar="MODEL", help="GPU model, matched by words without regard to case (H100 "
                   "matches 'H100 SXM')")
    p.add_argument("--min-gpus", type=_count, default=0, metavar="N", help="at least N GPUs")
    p.add_argument("--max-price", type=_price, default=None, metavar="X", help="at most X per hour")
    add_globals(p, "offers")  # --repo, --config, --json


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU count (0-64)")
    return int(text)


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a price per hour (0-100000)")
    return value


def listing(provider, ctx) -> list[dict]:
    """One provider's offers as rows: live where it has a market, else its catalog."""
    from reconciler.rentals.providers.base import adapter_for
    from reconciler.spec.offers import selections

    adapter = adapter_for(provider, ctx)
    name = provider.metadata.name
    if not hasattr(adapter, "live_offers"):
        return [_row(name, o, True, o.spot, o.id) for o in provider.spec.offers]
    live = adapter.live_offers()
    # the id a pass would rent each live offer as: its catalog entry's, or its own without a catalog
    chosen = {x: (entry.id if entry is not None else x.id) for x, entry in selections(provider, live)}
    return [_row(name, x, x.available, x.spot, chosen.get(x)) for x in live]


def _row(provider: str, o, available: bool, spot: bool, planned: str | None) -> dict:
    return {"provider": provider, "resource": o.resource or getattr(o, "id", None), "gpu": o.gpu_type,
            "gpu_count": o.gpu_count, "gpu_memory_gb": _round(o.gpu_memory_gb), "cpus": o.cpu_count,
            "memory_gb": _round(o.memory_gb),
            "region": o.region, "price_per_hour": o.price_per_hour, "spot": spot, "available": available,
            "offer": planned}


def _round(v: float | None) -> float | None:
    return round(v, 1) if v is not None else None


def _wanted(row: dict, args: argparse.Namespace) -> bool:
    from reconciler.spec.offers import gpu_matches

    if args.gpu and not (row["gpu_count"] and gpu_matches(row["gpu"], args.gpu)):
        return False
    if row["gpu_count"] < args.min_gpus:
        return False
    return args.max_price is None or (row["price_per_hour"] is not None and row["price_per_hour"] <= args.max_price)


def gather(providers: dict, ctx, parallel: int = 8) -> tuple[list[dict], dict[str, str]]:
    """Every provider listed at once (each call keeps to its provider's rate limit)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str):
        try:
            return name, listing(providers[name], ctx), None
        except ReconcilerError as e:
            return name, [], str(e)
        except Exception as e:  # noqa: BLE001 - one provider's trouble never hides the others
            return name, [], f"{type(e).__name__}: {e}"

    rows: list[dict] = []
    errors: dict[str, str] = {}
    if not providers:
        return rows, errors
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(providers)))) as pool:
        for name, got, error in pool.map(one, sorted(providers)):
            rows += got
            if error is not None:
                errors[name] = error
    return rows, errors


def cmd_offers(args: argparse.Namespace) -> int:
    from reconciler.rentals.providers.base import AdapterContext
    from reconciler.spec.load import load_tree
    from .commands import _cfg, _require_specs

    cfg = _cfg(args)
    _require_specs(cfg)
    desired = load_tree(cfg.repo)
    providers = dict(desired.providers)
    errors = {n: f"its spec is invalid: {why}" for n, why in desired.invalid_providers.items()}
    if args.provider:
        if args.provider not in providers and args.provider not in errors:
            known = ", ".join(sorted(set(providers) | set(errors))) or "none in specs/"
            raise UsageError(f"provider {args.provider!r} is not defined (known: {known})")
        providers = {k: v for k, v in providers.items() if k == args.provider}
        errors = {k: v for k, v in errors.items() if k == args.provider}
    ctx = AdapterContext(secret_source=os.environ.get, state_dir=cfg.state_dir, repo=cfg.repo)
    rows, failed = gather(providers, ctx, cfg.parallel_machines)
    errors.update(failed)
    rows = sorted((r for r in rows if _wanted(r, args)),
                  key=lambda r: (r["price_per_hour"] if r["price_per_hour"] is not None else float("inf"),
                                 r["provider"], r["gpu_count"], r["resource"] or ""))
    if args.json:
        print(json.dumps({"offers": rows, "provider_errors": errors}, indent=2, sort_keys=True))
    else:
        _table(rows)
    for name, why in sorted(errors.items()):
        print(f"provider {name}: offers unavailable: {why.removeprefix(f'provider {name}: ')}", file=sys.stderr)
    return 1 if errors else 0


def _table(rows: list[dict]) -> None:
    from .commands import _print_table

    if not rows:
        print("No offers.")
        return

    def num(v, unit: str = "") -> str:
        return "-" if v is None else f"{v:g}{unit}"

    table = [COLUMNS]
    for r in rows:
        table.append((r["provider"], r["gpu"] or "-", str(r["gpu_count"]), num(r["gpu_memory_gb"], " GB"),
                      num(r["cpus"]), num(r["memory_gb"], " GB"), r["region"] or "-",
                      "-" if r["price_per_hour"] is None else f"{r['price_per_hour']:.2f}",
                      "yes" if r["spot"] else "no", "yes" if r["available"] else "no"))
    _print_table(table)
