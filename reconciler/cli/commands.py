"""Commands that drive the loop: --once, plan, status, logs, config (and the daemon's entry).

Their ``--json`` output is documented in docs/cli.md; a key may be added, none is renamed or removed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.core.errors import UsageError

from .common import _cfg, no_such_run, status_names  # noqa: F401 - shared with the other commands

if TYPE_CHECKING:
    from reconciler.core import config as configs

# The status files, the models and the planner are imported by the commands that use them: a
# ``--once`` over a settled tree needs none of them (reconciler/engine/quickpass.py), and their
# imports alone cost more than that pass.


def run(name: str, args: argparse.Namespace) -> int:
    if name == "once":
        return cmd_once(args, dry_run=args.dry_run)
    if name == "plan":
        return cmd_plan(args)
    if name == "status":
        return cmd_status(args)
    if name == "logs":
        return cmd_logs(args)
    if name == "rentals":
        return cmd_rentals(args)
    if name == "explain":
        return cmd_explain(args)
    if name == "config":
        cfg = _cfg(args)
        print(json.dumps(cfg.redacted(), indent=2, sort_keys=True))  # JSON with or without --json
        return 0
    if name == "provenance":
        from reconciler.artifacts.provenance import cmd_provenance
        from reconciler.core.identity import parse as parse_identity
        from reconciler.status import store as statuses

        cfg = _cfg(args)
        for wanted in (args.name, getattr(args, "diff", None)):
            # An identity (NAME-gG-aA) is looked up among the manifests, a run name by its status.
            if wanted and parse_identity(wanted) is None and statuses.load_one(cfg.repo / "status", wanted) is None:
                raise no_such_run(wanted, status_names(cfg))
        return cmd_provenance(args, cfg)
    if name in ("stop", "start", "restart"):
        from .steer import cmd_steer

        return cmd_steer(name, args, _cfg(args))
    if name == "ssh":
        from .shell import cmd_ssh

        return cmd_ssh(args, _cfg(args))
    if name == "daemon":
        from reconciler.daemon.service import main as daemon_main

        return daemon_main(args)
    raise UsageError(f"unknown command {name}")


def _require_specs(cfg: configs.Config) -> None:
    from reconciler.spec.load import is_spec_repo

    if not is_spec_repo(cfg.repo):
        raise UsageError(f"{cfg.repo}: no specs/ or execution_templates/ here (use --repo DIR)")


def cmd_plan(args: argparse.Namespace) -> int:
    """``plan``: the dry run of a pass, or with ``--offline`` the plan on the recorded world."""
    from reconciler.planner.render import text as plan_text
    from reconciler.status import store as statuses

    if not args.offline:
        if args.github:
            raise UsageError("--github needs --offline (a pull request's job asks no machine)")
        return cmd_once(args, dry_run=True)
    from reconciler.status.offline import has_changes, recorded_world
    from reconciler.core.plan import PlanSettings
    from reconciler.planner.make import make_plan
    from reconciler.spec.load import load_tree

    cfg = _cfg(args)
    _require_specs(cfg)
    now = time.time()
    desired = load_tree(cfg.repo)
    previous = statuses.load_all(cfg.repo / "status")
    settings = PlanSettings(unreachable_grace=cfg.unreachable_grace, orphan_grace=cfg.orphan_grace,
                            local_max_tasks=cfg.local_max_tasks, local_gpus=cfg.local_gpus or 0)
    plan = make_plan(desired, recorded_world(desired, previous, now), previous, now, settings)
    if args.json:
        out = plan.to_json()
        out["offline"] = True
        out["diagnostics"] = [d.text() for d in desired.diagnostics]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for d in desired.diagnostics:
            print(d.text(), file=sys.stderr)
        print("Offline plan: from the specs and the committed status files; machines not asked.")
        print(plan_text(plan))
    if args.github:
        from .prcomment import markdown, report

        for line in report(markdown(plan, offline=True, diagnostics=[d.text() for d in desired.diagnostics])):
            print(line, file=sys.stderr)
    if desired.diagnostics and args.detailed_exitcode:
        return 1
    return 2 if args.detailed_exitcode and has_changes(plan) else 0


def cmd_once(args: argparse.Namespace, dry_run: bool) -> int:
    """One pass, or its plan. Exit 0, or 1 when an action of the pass failed (the others were still
    applied, and the failure is in the run's status); a plan has no actions and exits 0."""
    from reconciler.core import configcache
    from reconciler.planner.render import text as plan_text

    flags = {}
    if getattr(args, "no_commit", False):
        flags["commit"] = False
    if getattr(args, "allow_dirty", False):
        flags["allow_dirty"] = True
    if getattr(args, "log_format", None):
        flags["log_format"] = args.log_format
    repo = Path(getattr(args, "repo", None) or ".")
    inputs = configcache.Inputs(repo.resolve(), getattr(args, "config", None), flags) if repo.is_dir() else None
    result = _quick_once(configcache.cached(inputs) if inputs is not None else None, dry_run)
    if result is None:
        result = _full_once(args, flags, inputs, dry_run)
    if args.json:
        out = result.plan.to_json()
        if not dry_run:
            out.update(written=result.written, transitions=result.transitions, commit=result.commit,
                       committed=result.committed,
                       outcomes=[{"name": o.name, "action": o.action, "ok": o.ok, "error": o.error,
                                  "permanent": o.permanent} for o in result.outcomes])
        out["diagnostics"] = [d.text() for d in result.desired.diagnostics]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        for d in result.desired.diagnostics:
            print(d.text(), file=sys.stderr)
        print(plan_text(result.plan))
        if not dry_run:
            failed = [o for o in result.outcomes if not o.ok]
            for o in failed:
                kind = "permanent" if o.permanent else "will retry"
                print(f"  error: {o.name}: {o.action} failed ({kind}): {o.error}")
            if result.transitions:
                print("\nStatus:")
                for t in result.transitions:
                    print(f"  {t}")
            if result.commit:
                earlier = len(set(result.committed) - set(result.written))
                note = f", {earlier} of them written by an earlier pass" if earlier else ""
                print(f"\nCommitted {len(result.committed)} status file(s) as {result.commit[:10]}{note}.")
            elif result.written:
                print(f"\nWrote {len(result.written)} status file(s) (not committed).")
    if dry_run and getattr(args, "detailed_exitcode", False):
        from reconciler.status.offline import has_changes

        return 1 if result.desired.diagnostics else (2 if has_changes(result.plan) else 0)
    return 1 if any(not o.ok for o in result.outcomes) else 0


def _full_once(args: argparse.Namespace, flags: dict, inputs, dry_run: bool):
    """The pass: the configuration validated, the tree loaded, the machines asked, the plan applied."""
    from reconciler.core import configcache
    from reconciler.daemon.logs import setup_logging
    from reconciler.engine.loop import Reconciler

    cfg = _cfg(args, **flags)
    _require_specs(cfg)
    if not dry_run and inputs is not None:  # a plan changes nothing, in the working state neither
        configcache.save(inputs, cfg.model_dump(mode="json"))
    setup_logging(cfg.log_format)  # the pass's log lines (and libraries'), formatted as the daemon's
    rec = Reconciler(cfg)
    if dry_run:
        return rec.run_pass(dry_run=True)
    from reconciler.daemon.lock import RepoLock

    with RepoLock(cfg.state_dir):  # held by a running daemon: exit 2, naming it
        return rec.run_pass()


def _quick_once(cfg, dry_run: bool):
    """The pass of a tree whose runs are all settled, proved to plan nothing without loading it
    (reconciler/engine/quickpass.py), as the full pass's result; None: the full pass must run.
    ``cfg``: the configuration last validated under the same inputs (None: not known)."""
    from reconciler.spec.tree import SPEC_DIRS

    if cfg is None or not any((cfg.repo / top).is_dir() for top in SPEC_DIRS):
        return None  # the full pass says what is wrong
    from types import SimpleNamespace

    from reconciler.daemon.logs import setup_logging
    from reconciler.engine import quickpass

    setup_logging(cfg.log_format)
    if dry_run:
        plan = quickpass.check(cfg, dry_run=True)
    else:
        from reconciler.daemon.lock import RepoLock

        with RepoLock(cfg.state_dir):  # held by a running daemon: exit 2, naming it
            plan = quickpass.check(cfg)
    if plan is None:
        return None
    return SimpleNamespace(plan=plan, written=[], transitions=[], commit=None, committed=[], outcomes=[],
                           desired=SimpleNamespace(diagnostics=[]))


def _age(text: str | None, now: float) -> str:
    from reconciler.core.runstatus import parse_iso

    t = parse_iso(text)
    if t is None:
        return "-"
    s = max(0, int(now - t))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell; the last one, free text, is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(r, widths))
        print(f"{line}  {r[-1]}" if r[-1] else line.rstrip())


def machine_states(cfg: configs.Config) -> list[dict]:
    """Each machine as the reconciler sees it now (one probe each): attached, draining (taking
    nothing new, work still running), drained (nothing left: free for manual use) or unreachable."""
    from reconciler.status import store as statuses

    from reconciler.engine.observe import observe
    from reconciler.core.names import LOCAL
    from reconciler.spec.load import load_tree
    from reconciler.machines.pool import recorded_pool

    desired = load_tree(cfg.repo)
    previous = statuses.load_all(cfg.repo / "status")
    pool = recorded_pool(cfg, desired, previous)
    fleet = {m.name: m for f in desired.fleets.values() for m in f.spec.machines}
    try:
        world = observe(pool.machines(previous), pool.get, [], previous, time.time())
    finally:
        pool.close()
    out = []
    for name, obs in sorted(world.machines.items()):
        m = fleet.get(name)
        tasks = sum(1 for r in obs.runs.values() if r.alive)
        why = None
        if m is not None and m.max_tasks == 0:
            why = "max_tasks 0 in its Fleet"
        elif obs.draining is not None:
            why = obs.draining
        if not obs.reachable:
            state, why = "unreachable", obs.error
        elif why is not None:
            state = "draining" if tasks else "drained"
        else:
            state = "attached"
        if obs.reachable and obs.gpu_error:  # foreign_gpus: avoid failed closed: say so, whatever the state
            why = "; ".join(filter(None, [why, f"GPUs withheld (foreign_gpus: avoid): {obs.gpu_error}"]))
        out.append({"name": name, "connect": "local" if name == LOCAL else (m.connect if m else "-"),
                    "state": state, "tasks": tasks, "max_tasks": m.max_tasks if m else None,
                    "foreign_gpus": obs.foreign_gpus, "gpu_error": obs.gpu_error, "reason": why or ""})
    return out


def cmd_machines(args: argparse.Namespace) -> int:
    rows = machine_states(_cfg(args))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    table = [("MACHINE", "CONNECT", "STATE", "TASKS", "REASON")]
    for r in rows:
        limit = "" if r["max_tasks"] is None else f"/{r['max_tasks']}"
        table.append((r["name"], r["connect"], r["state"], f"{r['tasks']}{limit}", r["reason"][:100]))
    _print_table(table)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """What a pass would decide for the run now (a dry run: nothing is changed), every machine and
    offer it considered and why, its priority and team, and the decision its status recorded."""
    from reconciler.core.actions import Action
    from reconciler.status import store as statuses

    from reconciler.engine.loop import Reconciler
    from reconciler.planner.quota import Quotas, priority_of

    cfg = _cfg(args)
    _require_specs(cfg)
    rec = Reconciler(cfg)
    result = rec.run_pass(dry_run=True)
    desired = result.desired
    change = result.plan.for_run(args.name)
    st = statuses.load_one(cfg.repo / "status", args.name)
    if change is None and st is None:
        raise no_such_run(args.name, {*desired.runs, *status_names(cfg)})
    entry = desired.runs.get(args.name)
    value, cls = priority_of(desired, entry)
    q = Quotas.build(desired, result.world, {})
    team = q.team(args.name)
    doc = {"name": args.name, "now": None, "priority": {"class": cls or None, "value": value}, "team": team,
           "recorded": st.placement if st is not None else None}
    if change is not None:
        doc["now"] = {"action": change.action, "code": change.code, "reason": change.reason,
                      "machine": change.machine, "rental": change.rental, "considered": change.considered}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    if change is not None:
        where = f" on {change.machine}" if change.machine else ""
        if change.rental and change.action == Action.PROVISION:
            where = f" renting {change.rental['provider']}/{change.rental['offer']} at {change.rental['price_per_hour']:g}/h"
        print(f"{args.name}: {change.action}{where} ({change.code})")
        print(f"  {change.reason}")
        if change.considered:
            print("  considered:")
            for line in change.considered:
                print(f"    {line}")
    print(f"  priority: {cls or 'none'} ({value})" + (f"; team: {team}" if team else ""))
    if team and q.limits(team) is not None:
        used = q.usage.get(team, [0.0, 0.0])
        lim = q.limits(team)
        print(f"  team {team} now holds {used[0]:g} GPU(s)" + (f" of {lim.maxGpus}" if lim.maxGpus is not None else "")
              + f", rents {used[1]:g}/h" + (f" of {lim.maxPricePerHour:g}/h" if lim.maxPricePerHour is not None else ""))
    if st is not None and st.placement:
        print(f"  recorded at the last decision ({st.placement.get('action')}, {st.placement.get('code')}):")
        for line in st.placement.get("considered", []):
            print(f"    {line}")
    return 0


def rental_rows(cfg: configs.Config, now: float | None = None):
    """Every rental named as this repository's, with what a pass would do about it: the dry-run
    plan's release changes are the reaper's list (one rule for the daemon and this command)."""
    from reconciler.core.actions import Action
    from reconciler.core.runstatus import cost_so_far
    from reconciler.status import store as statuses

    from reconciler.engine.loop import Reconciler

    rec = Reconciler(cfg)
    result = rec.run_pass(dry_run=True, now=now)
    now = result.plan.at
    releases = {c.machine: c for c in result.plan.changes if c.action == Action.RELEASE}
    previous = statuses.load_all(cfg.repo / "status")
    runs: dict[str, tuple[str, float]] = {}
    for name, st in previous.items():
        if st.handle is None:
            continue
        m = st.handle.machine or (f"{st.handle.rental['provider']}/{st.handle.rental['id']}"
                                  if st.handle.rental and st.handle.rental.get("id") else None)
        if m in result.world.rentals:
            runs.setdefault(m, (name, cost_so_far(st, now)))
    rows = []
    for m, r in sorted(result.world.rentals.items()):
        run, cost = runs.get(m, ("", 0.0))
        age = now - r.created_at if r.created_at else None
        c = releases.get(m)
        rows.append({"machine": m, "provider": r.provider, "id": r.id, "name": r.name, "run": run or None,
                     "state": r.state, "offer": r.offer, "age_seconds": round(age, 1) if age is not None else None,
                     "price_per_hour": r.price_per_hour,
                     "rental_cost": round((r.price_per_hour or 0.0) * age / 3600.0, 4) if age is not None else None,
                     "run_cost": round(cost, 4), "orphan": m in result.plan.orphans,
                     "release": {"code": c.code, "reason": c.reason} if c is not None else None})
    return rows, result, rec


def cmd_rentals(args: argparse.Namespace) -> int:
    from reconciler.core.runstatus import iso

    cfg = _cfg(args)
    _require_specs(cfg)
    rows, result, rec = rental_rows(cfg)
    errors = result.world.provider_errors
    reaped: list[dict] = []
    failed = False
    if args.reap and not args.reap_dry_run:
        for row in rows:
            if row["release"] is None:
                continue
            try:
                rec.providers.get(row["provider"]).terminate(row["id"])
                reaped.append({"machine": row["machine"], **row["release"]})
            except Exception as e:  # noqa: BLE001 - report and go on with the others
                failed = True
                print(f"reconcile: {row['machine']}: {e}", file=sys.stderr)
    if args.json:
        print(json.dumps({"rentals": rows, "provider_errors": errors, "reaped": reaped}, indent=2, sort_keys=True))
        return 1 if failed else 0
    if not rows:
        print("No rentals." + ("" if not errors else ""))
    else:
        table = [("MACHINE", "RUN", "STATE", "OFFER", "AGE", "PRICE/H", "COST", "ORPHAN")]
        for r in rows:
            age = _age(iso(result.plan.at - r["age_seconds"]), result.plan.at) if r["age_seconds"] is not None else "-"
            table.append((r["machine"], r["run"] or "-", r["state"], r["offer"] or "-", age,
                          f"{r['price_per_hour']:g}" if r["price_per_hour"] is not None else "-",
                          f"{r['rental_cost']:.2f}" if r["rental_cost"] is not None else "-",
                          "yes" if r["orphan"] else "no"))
        _print_table(table)
    for name, why in sorted(errors.items()):
        print(f"provider {name}: inventory unavailable: {why}", file=sys.stderr)
    if args.reap:
        todo = [r for r in rows if r["release"] is not None]
        verb = "would give back" if args.reap_dry_run else "gave back"
        if not todo:
            print("Nothing to reap.")
        for r in todo:
            if args.reap_dry_run or any(x["machine"] == r["machine"] for x in reaped):
                print(f"{verb} {r['machine']}: {r['release']['code']}: {r['release']['reason']}")
    return 1 if failed else 0


def cmd_status(args: argparse.Namespace) -> int:
    from reconciler.status import store as statuses

    if getattr(args, "machines", False):
        if args.name:
            raise UsageError("status --machines takes no run NAME")
        return cmd_machines(args)
    cfg = _cfg(args)
    output = _status_output(args)
    all_status = statuses.load_all(cfg.repo / "status")
    if args.name:
        st = all_status.get(args.name)
        if st is None:
            raise no_such_run(args.name, all_status)
        all_status = {args.name: st}
    if output == "json":
        docs = {n: s.model_dump(mode="json", exclude_none=True) for n, s in all_status.items()}
        print(json.dumps(docs[args.name] if args.name else docs, indent=2, sort_keys=True))
        return 0
    if output == "yaml":
        print("---\n".join(statuses.dump(st) for _, st in sorted(all_status.items())), end="")
        return 0
    now = time.time()
    rows = [("NAME", "PHASE", "GEN/ATT", "MACHINE", "AGE", "SINCE", "MESSAGE")]
    for name, st in sorted(all_status.items()):
        created = st.created_at or (st.history[0].time if st.history else st.observed_at)
        since = st.history[-1].time if st.history else st.observed_at
        rows.append((name, st.phase, f"{st.generation}/{st.attempt}", (st.handle and st.handle.machine) or "-",
                     _age(created, now), _age(since, now), (st.message or "")[:80]))
    _print_table(rows)
    return 0


def _status_output(args: argparse.Namespace) -> str:
    """--json is -o json; with another -o the two disagree, and neither may win silently."""
    output = getattr(args, "output", None)
    if args.json and output not in (None, "json"):
        raise UsageError(f"--json and -o {output} disagree; give one of them")
    return output or ("json" if args.json else "table")


def cmd_logs(args: argparse.Namespace) -> int:
    from reconciler.status import store as statuses

    from .logs import follow_logs

    cfg = _cfg(args)
    if statuses.load_one(cfg.repo / "status", args.name) is None:
        raise no_such_run(args.name, status_names(cfg))
    return follow_logs(cfg, args.name, args.stream, args.lines, args.follow, as_json=args.json,
                       raw=True if getattr(args, "raw", False) else None,
                       timestamps=getattr(args, "timestamps", False))
