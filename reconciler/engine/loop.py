"""One reconcile pass: load → observe → plan → apply → summarize → commit.

Level-triggered: a pass looks at the whole world each time and relies on no memory of earlier
passes beyond what git holds (specs and status files) and what the machines report. Running a pass
twice, or after a crash at any point, converges to the same world without launching twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reconciler.gitops import repo as gitops
from reconciler.status import store as statuses
from reconciler.core.runstatus import DIRTY, TERMINAL, cost_so_far
from reconciler.status.summarize import records_new_spec
from reconciler.core.actions import Action
from typing import TYPE_CHECKING
if TYPE_CHECKING:  # imported when a plan has something to apply: a pass that changes nothing never needs it
    from .apply import Outcome
from reconciler.core.config import Config
from reconciler.planner.exposure import shared_login_warnings
from reconciler.status.ledger import Ledger
from .observe import names_to_watch, observe
from .uncommitted import Uncommitted, hold_uncommitted, repo_key as uncommitted_key
from . import collector, downtime, focus, guards, passcache, statusstep, steady
from .rehome import rehome, worth_it as worth_rehoming
from .passcache import Settled
from reconciler.core.observed import ObservedWorld
from reconciler.core.parse_reuse import ParseMemo
from reconciler.core.plan import Plan, PlanSettings
from reconciler.planner.make import make_plan
from reconciler.rentals.inventory import Providers
from reconciler.spec.load import DesiredState, SpecCache, load_tree
from reconciler.machines.pool import TransportPool

log = logging.getLogger("reconciler")
_STARTS, _NONE = (Action.LAUNCH, Action.RELAUNCH), Action.NONE  # an Enum member looked up on its class costs a call


def _after_apply() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a kill),
    between applying a plan (runs launched) and writing any status."""


@dataclass
class PassResult:
    desired: DesiredState
    world: ObservedWorld
    plan: Plan
    outcomes: list[Outcome] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    commit: str | None = None
    committed: list[str] = field(default_factory=list)  # the runs whose status files the commit holds
    duration: float = 0.0
    retry_after: float | None = None  # the soonest a run asked to be looked at again
    plan_reused: bool = False  # the last pass's plan, proved to be this one's (steady.py)


def local_gpus(cfg: Config) -> int:
    if cfg.local_gpus is not None:
        return cfg.local_gpus
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: no GPUs here
        return 0


class Reconciler:
    """Holds what may be reused between passes in one process: the spec cache and connections."""

    def __init__(self, cfg: Config, keep_connections: bool = False):
        self.cfg = cfg
        # A long-lived reconciler (the daemon) keeps its SSH connections from pass to pass.
        self.connections: dict | None = {} if keep_connections else None
        self.transport_factory = None  # benchmarks/scale_bench.py: simulated machines instead of SSH
        self.cache = SpecCache()
        self.status_cache = statuses.StatusCache()
        self.live_cache = statuses.StatusCache()  # progress waiting for its status file (.reconciler/live-status)
        self._as_filed: dict[str, statuses.RunStatus] = {}
        self._dirty: set[str] = set()  # spec files with uncommitted changes, this pass
        self.ledger = Ledger()  # status/README.md and the loss curves, rows kept across passes
        self.parse_memo = ParseMemo()  # run entries a machine repeats are not validated again
        # What the last plan came from, for a pass over a fleet at rest (steady.py); the plan a pass
        # took and its length; the missing secrets and settings the pass planned with.
        self._steady = self._taken = self._reused = self._planned_with = None
        self.focus = focus.State()  # what a pass woken by an edit looks at afresh (focus.py)
        # Finished runs that nothing has touched since: neither parsed, held nor planned until their
        # spec digest, their status file or the machines' view of them changes (see _settle).
        self.settled: dict[str, Settled] = {}
        self.phase_counts: Counter[str] = Counter()
        self.repo = gitops.open_repo(cfg.repo)
        self._gpus: int | None = None
        # Where a run's secrets are looked up at launch (the reconciler host's environment).
        self.secret_source: Callable[[str], str | None] = os.environ.get
        self.providers = Providers(cfg.repo, cfg.state_dir, lambda name: self.secret_source(name))
        self._passes = 0  # counts passes for the periodic full collection
        self._status_clean: list | None = None  # see _commit
        # What an earlier process learnt (reconciler/engine/passcache.py): a fresh --once reads and
        # parses only what changed since.
        self._rehome = False  # the last pass parsed so much that its records are read back (rehome.py)
        self.adopt(passcache.restore(cfg.state_dir, cfg.repo, self.cache))

    def adopt(self, restored: passcache.Restored | None) -> None:
        """Take what the pass cache restored into ``self.cache`` (on start, and by rehome.py)."""
        cfg = self.cfg
        if restored is not None and (restored.ledger is not None or not cfg.ledger):
            # Settled runs' statuses are not read: the ledger's rows for them come with them.
            self.settled = restored.settled
            if restored.ledger is not None:
                self.ledger.rows, key = restored.ledger
                self.ledger._key = tuple(key) if key is not None else None
        self.dirty = Uncommitted(*((restored.dirty_key, restored.dirty) if restored is not None else ()))
        self._saved: tuple | None = (self.cache.hits, dict(self.settled), self.dirty.key, restored.clean,
                                     self.ledger._key) if restored else None

    def settings(self) -> PlanSettings:
        if self._gpus is None:
            self._gpus = local_gpus(self.cfg)
        return PlanSettings(unreachable_grace=self.cfg.unreachable_grace, orphan_grace=self.cfg.orphan_grace,
                            local_max_tasks=self.cfg.local_max_tasks, local_gpus=self._gpus,
                            gang_heartbeat_timeout=self.cfg.gang_heartbeat_timeout)

    def run_pass(self, dry_run: bool = False, commit: bool | None = None, now: float | None = None) -> PassResult:
        if not self._passes:  # a first pass parses everything: its parse trees' cycles are collected as it goes
            return self._run_pass(dry_run, commit, now)
        with collector.paused():  # why: collector.py
            return self._run_pass(dry_run, commit, now)

    def _run_pass(self, dry_run: bool, commit: bool | None, now: float | None) -> PassResult:
        t0 = time.perf_counter()
        if self._rehome:
            self._rehome = False
            rehome(self)
        cfg = self.cfg
        now = time.time() if now is None else now
        desired = load_tree(cfg.repo, self.cache, tree_version=gitops.head(self.repo))
        if self.repo is not None:  # git status -- specs, beside the observation (uncommitted.py)
            self.dirty.prefetch(self.repo, self.cache.tree_changed, self.cache.ignores)
        status_dir = cfg.repo / "status"
        runs, invalid = desired.runs, desired.invalid
        candidates = {n: s.key for n, s in self.settled.items()
                      if n not in invalid and (e := runs.get(n)) is not None and e.digest == s.digest
                      or s.digest is None and n not in runs and n not in invalid}
        skipped: set[str] = set()
        previous = statuses.load_all(status_dir, self.status_cache, skip=candidates, skipped=skipped)
        if self.status_cache.changed:
            self._status_clean = None  # status/ moved since the last commit step: git is asked again
        # Progress not yet in a status file (status_progress_interval) lives in the working state:
        # the pass goes on from it, so a loss curve gains a point every pass, not every write.
        self._as_filed = statuses.overlay_live(previous, cfg.state_dir, self.live_cache)
        pool = TransportPool(cfg, desired, self.connections, self.transport_factory)
        try:
            focus.begin(self, desired, previous, pool)  # this machine: a fresh look at the edited runs only
            world = self._observe_world(desired, previous, skipped, pool, status_dir, now)
            plan = self._plan(desired, world, previous, skipped, now)
            world, plan, now = guards.before_apply(self, dry_run, desired, world, plan, previous, skipped, pool, now)
            result = PassResult(desired, world, plan)
            if dry_run:
                result.duration = time.perf_counter() - t0
                return result
            spec_commits = self._apply(result, previous, pool)
            guards.after_apply(self, plan)
        finally:
            pool.close()
        result.plan_reused = self._reused is not None and plan is self._reused[0]
        if result.plan_reused and len(plan.changes) == self._reused[1]:
            # The last pass's plan, whose status step found every status unchanged from the same inputs.
            phases, written = {n: st.phase for n, st in previous.items()}, {}
            steady.renew(self)
        else:
            phases, written, unchanged_all = self._write_statuses(result, previous, spec_commits, status_dir, now)
            steady.keep(self, result, previous, skipped, unchanged_all)
        if cfg.ledger:
            loaded = {**previous, **self._as_filed} if self._as_filed else previous  # git's view
            ledger_out = self.ledger.refresh(status_dir, loaded, written, now, self.status_cache.present())
        else:
            ledger_out = []
        if result.written or ledger_out:
            self._status_clean = None
        # A run whose last machine is a rental still up keeps its status loaded: it dates the
        # rental's idle time (and so when it is given back).
        rented = world.rentals
        on_rentals = {n: st for n, st in previous.items()
                      if st.handle is not None and st.handle.machine in rented} if rented else {}
        costs = {n: ((st.cost or {}).get("provider"), cost_so_far(st, now))
                 for n, st in ({**previous, **written} if written else previous).items() if st.cost}
        del previous  # the parsed statuses of settled runs can go now
        self._settle(desired, world, plan, skipped, phases, status_dir, on_rentals, costs)
        waits = [c.retry_after for c in plan.changes if c.retry_after]
        result.retry_after = min(waits) if waits else None
        do_commit = cfg.commit if commit is None else commit
        if do_commit and self.repo is not None:
            self._commit(result, written)
        saved_before = self._saved
        self._save_cache(desired)
        self._rehome = worth_rehoming(self, saved_before)
        result.duration = time.perf_counter() - t0
        self._gc(result)
        return result

    def _save_cache(self, desired: DesiredState | None = None) -> None:
        """Write the pass cache when this pass learnt something a fresh process would redo."""
        passcache.save_changed(self, desired)

    def _observe_world(self, desired: DesiredState, previous: dict[str, statuses.RunStatus], skipped: set[str],
                       pool: TransportPool, status_dir: Path, now: float) -> ObservedWorld:
        """What the machines and providers report, with the status of every settled run one of
        them reports an attempt of loaded into ``previous`` (and taken out of ``skipped``)."""
        cfg = self.cfg
        rentals, provider_errors = self._observe_rentals(desired)
        pool.add_rentals(rentals, provider_errors, self.providers, previous)
        machines = pool.machines(previous)
        # A settled run's status is read only if a machine reports one of its attempts: the
        # report must be bound to the machine that status records. Every other status is in
        # ``previous`` already, so a name a machine makes up costs no file open.
        looked: dict[str, statuses.RunStatus | None] = {}

        def recorded(name: str) -> statuses.RunStatus | None:
            if name not in skipped:
                return None
            if name not in looked:
                looked[name] = statuses.load_one(status_dir, name)
            return looked[name]

        world = observe(machines, pool.get, names_to_watch(desired, previous, frozenset(skipped)), previous,
                        now, cfg.parallel_machines, recorded=recorded, memo=self.parse_memo)
        world.rentals, world.provider_errors = rentals, provider_errors
        if rentals:
            from reconciler.rentals import checkpoints

            world.saved_checkpoints = checkpoints.saved(cfg.state_dir)
        if desired.storages:
            storage_outputs(desired, world, previous, cfg.repo_namespace)
        downtime.mark(cfg.state_dir, world, now)  # since when each silent machine is silent
        from .lookalikes import first_seen  # orphan_grace of instances without a start time

        world.first_seen = first_seen(cfg.state_dir, world, now)
        for name in [n for n in skipped if world.instances(n)]:  # something of it is out there again
            st = looked[name] if name in looked else statuses.load_one(status_dir, name)
            skipped.discard(name)
            if st is not None:
                previous[name] = st
        return world

    def _plan(self, desired: DesiredState, world: ObservedWorld, previous: dict[str, statuses.RunStatus],
              skipped: set[str], now: float) -> Plan:
        cfg = self.cfg
        missing = {name: [s for s in e.secrets if self.secret_source(s) is None]
                   for name, e in desired.runs.items() if e.secrets}
        settings = self.settings()
        if desired.providers or world.rentals:
            settings.namespace = cfg.repo_namespace
            settings.bad_offers = dict(self.providers.bad_offers)
            settings.spend = self._spend(previous, now)
        missing = {n: m for n, m in missing.items() if m}
        self._planned_with = missing, settings
        reused = steady.take(self, desired, world, previous, skipped, missing, settings, now)
        plan = reused[0] if reused is not None else self._plan_afresh(desired, world, previous, skipped, now,
                                                                       settings, missing)
        self._dirty = self.dirty.specs(self.repo, self.cache.tree_changed, self.cache.ignores) \
            if self.repo is not None else set()
        if reused is not None and frozenset(self._dirty) != reused[1]:  # git status answered: it moved
            plan, reused = self._plan_afresh(desired, world, previous, skipped, now, settings, missing), None
        self._reused = (plan, len(plan.changes)) if reused is not None else None
        if not cfg.allow_dirty:
            hold_uncommitted(plan, desired, previous, self._dirty)
        return plan

    def _plan_afresh(self, desired, world, previous, skipped, now, settings, missing) -> Plan:
        plan = make_plan(desired, world, previous, now, settings, settled=frozenset(skipped), missing_secrets=missing)
        # Secrets are only as private as the unix login the runs share: say where teams share one.
        plan.warnings.extend(shared_login_warnings(desired, world, plan))
        return plan

    def _apply(self, result: PassResult, previous: dict[str, statuses.RunStatus],
               pool: TransportPool) -> dict[str, str]:
        """Carry out the plan into ``result.outcomes``; return the spec commits it looked up."""
        cfg = self.cfg
        plan = result.plan
        # One history walk per pass for every spec commit it needs: bundles and status files.
        spec_commits = self._spec_commits(plan, previous)
        if not any(c.mutates for c in plan.changes):
            _after_apply()
            return spec_commits
        from reconciler.artifacts import safetar
        from .apply import ApplyContext, apply

        ctx = ApplyContext(repo=cfg.repo, desired=result.desired, transport_for=pool.get,
                           repo_head=gitops.head(self.repo),
                           spec_commits=spec_commits,
                           terminate_grace=cfg.terminate_grace, remote_cleanup=cfg.remote_cleanup,
                           parallel=cfg.parallel_changes, machine_python=pool.python_for,
                           secret_source=self.secret_source, providers=self.providers,
                           rental_key=pool.rental_key, ssh_ready_timeout=cfg.ssh_ready_timeout,
                           checkpoint_copy_mbps=cfg.checkpoint_copy_mbps,
                           collect_limits=safetar.Limits(cfg.collect_max_bytes, cfg.collect_max_files),
                           repo_id=cfg.repo_namespace if result.desired.storages else "", inflight=guards.journal(self))
        result.outcomes = apply(plan, ctx)
        _after_apply()
        return spec_commits

    def _write_statuses(self, result: PassResult, previous: dict[str, statuses.RunStatus],
                        spec_commits: dict[str, str], status_dir: Path, now: float):
        """Write the status file of every change whose status moved (statusstep.py)."""
        return statusstep.write(self, result, previous, spec_commits, status_dir, now)

    def _commit(self, result: PassResult, written: dict[str, statuses.RunStatus]) -> None:
        """Commit the status files the pass changed, with one message line per transition.

        Git is not asked when nothing under status/ can differ from HEAD since the last commit step
        of this process found it clean: no status file written, new, changed or gone (in any pass
        since, committing or not), no ledger file written, and HEAD, the index and the ignore files
        as they were then."""
        cfg = self.cfg
        if self._status_clean is not None and self._status_clean == uncommitted_key(self.repo):
            return
        lines = {line.split(":", 1)[0]: line for line in result.transitions}

        def message(paths: list[str]) -> str:
            names = [Path(p).stem for p in paths]
            at_head = gitops.head_blobs(self.repo, [p for n, p in zip(names, paths) if n not in lines])
            found = [lines.get(n) or _transition_since_head(self.repo, p, at_head[p], written.get(n))
                     for n, p in zip(names, paths)]
            return gitops.transitions_message([t for t in found if t], files=len(paths))

        self._status_clean = None
        made = gitops.commit_status(self.repo, message, gitops.Author(cfg.author_name, cfg.author_email))
        if made is not None:
            result.commit, result.committed = made.sha, [Path(p).stem for p in made.paths]
        self._status_clean = uncommitted_key(self.repo)

    def _gc(self, result: PassResult) -> None:
        """The collector after a pass (collector.py): the pass's cycles, if it did work, then freeze."""
        self._passes += 1
        busy = bool(result.outcomes or result.written or self.cache.parsed or self.status_cache.parsed)
        collector.after_pass(self._passes, len(self.cache), busy)

    def _spec_commits(self, plan: Plan, previous: dict) -> dict[str, str]:
        """The spec commit of each run that launches, or whose status records a new spec, this
        pass: the last commit that changed its spec file (one definition, shared with provenance)."""
        paths = []
        for c in plan.changes:
            if c.phase is not None and c.spec_path and (
                    c.action in _STARTS or records_new_spec(previous.get(c.name), c)):
                paths.append(c.spec_path)
        if not paths or self.repo is None:
            return {}
        found = gitops.last_commits(self.cfg.repo, [p for p in paths if p not in self._dirty])
        # Launched from uncommitted content (allow_dirty): no commit holds what runs; say so.
        return {**found, **{p: DIRTY for p in paths if p in self._dirty}}

    def close(self) -> None:
        """Close the kept connections (the daemon, when it stops)."""
        for _, t in (self.connections or {}).values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        if self.connections is not None:
            self.connections.clear()

    def _observe_rentals(self, desired: DesiredState):
        errors: dict[str, str] = {}
        try:
            self.providers.sync(desired)
        except Exception as e:  # noqa: BLE001 - an adapter that cannot be made: its runs wait
            for name in desired.providers:
                errors[name] = str(e)
            return {}, errors
        rentals, found = self.providers.observe(self.cfg.repo_namespace, self.cfg.parallel_machines)
        errors.update(found)
        for name, why in desired.invalid_providers.items():
            errors.setdefault(name, f"its spec is invalid: {why}")
        return rentals, errors

    def _spend(self, previous: dict, now: float) -> dict[str, float]:
        """What each provider's rentals cost the runs so far: loaded statuses, and the settled
        runs' costs remembered when they settled."""
        spend: dict[str, float] = {}
        for name, st in previous.items():
            if st.cost and st.cost.get("provider"):
                spend[st.cost["provider"]] = spend.get(st.cost["provider"], 0.0) + cost_so_far(st, now)
        for name, s in self.settled.items():
            if name not in previous and s.provider:
                spend[s.provider] = spend.get(s.provider, 0.0) + s.cost
        return spend

    def _settle(self, desired: DesiredState, world: ObservedWorld, plan: Plan, skipped: set[str],
                phases: dict[str, str], status_dir: Path, on_rentals: dict | None = None,
                costs: dict | None = None) -> None:
        """Remember which runs are finished and untouched, and let go of their parsed status.

        A run settles when this pass planned nothing for it, its phase is final and nothing of it is
        alive or uncollected on any machine: the next pass would plan nothing again and leave its status as it
        is now on disk. Whatever could change that changes one of the recorded keys: a new spec
        digest (or the spec's removal or invalidity), a rewritten status file, or an instance
        showing up on a machine.
        """
        settled = {n: self.settled[n] for n in skipped}
        for c in plan.changes:
            if (c.action != _NONE or c.phase not in TERMINAL or c.name in desired.invalid
                    or any(r.alive or not r.collected or guards.kept(r, self.cfg) for r in world.instances(c.name))
                    or c.name in (on_rentals or {})):
                continue
            key = statuses.file_key(status_dir / f"{c.name}.yaml")
            if key is not None:
                provider, cost = (costs or {}).get(c.name, (None, 0.0))
                settled[c.name] = Settled(_digest(desired, c.name), key, c.phase, provider, cost)
                self.status_cache.forget(c.name)
                entry = desired.runs.get(c.name)
                if entry is not None:
                    entry.release()  # its model is parsed again only if something asks for it
        self.settled = settled
        counts: Counter[str] = Counter(s.phase for s in settled.values())
        counts.update(phase for n, phase in phases.items() if n not in settled)
        self.phase_counts = counts


def _transition_since_head(repo, path: str, old_text: str | None,
                           new: statuses.RunStatus | None = None) -> str | None:
    """The transition line of a status file from its version at HEAD to the file now, for files
    whose change this pass did not describe: written by an earlier pass and not committed then
    (--no-commit, or a crash before the commit), or rewritten now without a transition of its own
    (progress). ``old_text``: the file at HEAD; ``new``: the status this pass wrote, when it
    wrote one (not read again)."""
    new = new or statuses.load_one(Path(repo.working_tree_dir) / "status", Path(path).stem)
    if new is None:
        return f"{Path(path).stem}: status file removed"
    old = statuses.head_key(old_text)
    if old == (new.phase, new.generation, new.attempt):
        return None
    ident = new.handle.identity if new.handle and new.handle.identity else ""
    reason = new.history[-1].reason if new.history else new.message
    return f"{new.name}: {old[0] if old else '-'} → {new.phase} [{ident}] {reason}"[:300]


def _digest(desired: DesiredState, name: str) -> str | None:
    entry = desired.runs.get(name)
    return entry.digest if entry is not None else None


__all__ = ["Reconciler", "PassResult", "Settled"]


def storage_outputs(desired: DesiredState, world: ObservedWorld, previous: dict, repo_id: str) -> None:
    """Runs with a Storage: their machines' uploads.json checked against their own folder of the
    bucket (the status's outputs), and their checkpoints counted as saved, so that none is ever
    copied to this host (the machine uploads them)."""
    from reconciler.core.identity import parse
    from . import outputs

    outputs.bind(desired, repo_id, world, previous)
    outputs.hold_while_uploading(desired, world)
    for name in desired.runs:
        if outputs.has_storage(desired, name):
            for obs in world.instances(name):
                p = parse(obs.identity)
                if p is not None and obs.checkpoints:
                    saved = world.saved_checkpoints.setdefault((name, p.generation), set())
                    saved.update(c.rsplit("/", 1)[-1] for c in obs.checkpoints)
