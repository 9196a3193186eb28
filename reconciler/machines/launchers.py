"""Launch modes: what gets started in a workspace, the same way on every transport.

``host_process`` starts the launch wrapper in its own session (``setsid``) from a shell that exits
at once, so the job is nobody's child and no zombie is left behind. ``docker`` runs the same
wrapper in a container named and labelled by the identity, with the workspace mounted at /bundle.
Both first look for the identity and adopt it if it is already there.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time

from reconciler.core.boundary import parse_stop
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.tasks import env_lines
from .base import (WRONG_SPEC, LaunchResult, LaunchSpec, Transport, built_for_check, docker_prefix, launch_env_lines,
                   secrets_file, slurm_job_name)

# How long a launch waits, on the machine, for the wrapper to write its pid.
PID_WAIT = "i=0; while [ ! -s runtime/pid ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done"


def _in_workspace(spec: LaunchSpec) -> str:
    """Every launch script's start: into the workspace (exit 97 when it is gone), refuse one built
    for another spec (exit 96), and the folders the wrapper writes."""
    return (f"cd {shlex.quote(spec.workspace)} || exit 97\n" + built_for_check(spec.spec_digest)
            + "mkdir -p runtime artifacts\n")


# Exit codes of the guards run last before a job starts (_guard).
LATE = 94  # the machine's clock is past the launch's deadline
CLAIMED = 95  # the identity is claimed on this machine by a launch of another spec


# machines/local_launch.py runs _launch_host's script, _guard included, in-process on this machine:
# a change to either script is made there too.
def _guard(spec: LaunchSpec, not_after: float | None) -> str:
    """Shell lines run as the last step before the job starts. The identity is claimed on the
    machine, once and for one spec: a file beside the workspace that holds the spec digest, made
    whole and then hard-linked into place (link(2) fails with EEXIST rather than replace a file,
    POSIX.1-2017, so of two launches the first wins; the same digest again passes). Then the
    deadline: a launch issued by a reconciler that has died since may arrive late, and a
    successor waits only until its deadline (engine/inflight.py), so a launch past it never
    starts."""
    out = ""
    if spec.spec_digest:
        claim = shlex.quote(posixpath.join(posixpath.dirname(spec.workspace.rstrip("/")), f".{spec.identity}.claim"))
        want = shlex.quote(spec.spec_digest)
        out += (f"c={claim}\n"
                f"if [ ! -e \"$c\" ]; then printf '%s\\n' {want} > \"$c.$$\" && "
                "{ ln \"$c.$$\" \"$c\" 2>/dev/null || [ -e \"$c\" ] || mv \"$c.$$\" \"$c\"; }; rm -f \"$c.$$\"; fi\n"
                f"[ \"$(head -c 200 \"$c\" 2>/dev/null)\" = {want} ] || "
                f"{{ echo \"claimed by a launch of another spec\" >&2; exit {CLAIMED}; }}\n")
    if not_after is not None:
        out += (f"now=$(date +%s); [ \"$now\" -le {int(not_after)} ] || "
                f"{{ echo \"the machine's clock says $now\" >&2; exit {LATE}; }}\n")
    return out


def launch(t: Transport, spec: LaunchSpec, not_after: float | None = None) -> LaunchResult:
    """Start ``spec`` (or adopt it). ``not_after``: the reconciler's time after which the machine
    refuses to start it (None: no deadline)."""
    if spec.slurm is not None:  # its secrets wait on the login host, not in the shared workspace
        return _launch_slurm(t, spec, not_after)
    if spec.secrets:
        t.put_secret_file(spec.workspace, secrets_file(spec.secrets))
    if spec.storage_env:
        t.put_secret_file(spec.workspace, secrets_file(spec.storage_env), "storage.env")
    if spec.launch_mode == "docker":
        return _launch_docker(t, spec, not_after)
    return _launch_host(t, spec, not_after)


# Delivers a queued job's secrets, and its Storage's configuration and credentials, once its wrapper
# has started, from the login host, where they wait in a 0700 folder of the login's own temporary
# space (never on the shared file system while the job is queued). storage.env goes first and
# secrets.env (empty for a run without secrets) last: the wrapper waits for secrets.env, so
# storage.env is there when it reads it. It ends when they are delivered, or the job ended, or its
# workspace went, or Slurm no longer lists the job (checked every 30 s), and removes the folder on
# every way out. Arguments: workspace, holding folder, job id.
SECRETS_DELIVERER = r"""ws=$1 hold=$2 id=$3 n=0
while [ -d "$ws/runtime" ] && [ -f "$hold/runtime/secrets.env" ] && [ ! -e "$ws/runtime/result.json" ]; do
  if [ -e "$ws/runtime/started_at" ]; then
    (umask 077; if [ -f "$hold/runtime/storage.env" ]; then cp "$hold/runtime/storage.env" "$ws/runtime/.storage.env.tmp" \
      && mv "$ws/runtime/.storage.env.tmp" "$ws/runtime/storage.env"; fi \
      && cp "$hold/runtime/secrets.env" "$ws/runtime/.secrets.env.tmp" \
      && mv "$ws/runtime/.secrets.env.tmp" "$ws/runtime/secrets.env")
    break
  fi
  n=$((n+1))
  if [ $((n % 30)) -eq 0 ] && [ -n "$id" ]; then
    # Only an answer without the job ends the wait: a slurmctld that does not answer is no news.
    out=$(squeue -h -t PENDING,CONFIGURING,RUNNING,COMPLETING -u "$(id -un)" -o %i 2>/dev/null) \
      && ! printf '%s\n' "$out" | grep -qx "$id" && break
  fi
  sleep 1
done
rm -rf "$hold"
"""


def _hold_secrets(t: Transport, spec: LaunchSpec) -> str | None:
    """The run's secrets and its Storage's environment into a fresh 0700 folder of the login host's
    temporary space; its path, or None when there is nothing to hold or the job was already
    submitted (adopted: its deliverer has them)."""
    if not spec.secrets and not spec.storage_env:
        return None
    r = t.sh(_in_workspace(spec) + "if [ -s runtime/slurm_job ] || [ -e runtime/started_at ]; then exit 0; fi\n"
             'umask 077; mktemp -d "${TMPDIR:-/tmp}/rcl-secrets.XXXXXXXX"\n', timeout=30)
    _refuse_wrong_spec(t, spec, r.rc)
    if r.rc != 0:
        raise TemporaryError(f"no folder for the secrets on {t.machine.name}: {r.err.strip()[:200]}")
    hold = r.out.strip()
    if not hold:
        return None
    if spec.storage_env:
        t.put_secret_file(hold, secrets_file(spec.storage_env), "storage.env")
    t.put_secret_file(hold, secrets_file(spec.secrets or {}))  # last: the deliverer waits on it
    return hold


def _launch_slurm(t: Transport, spec: LaunchSpec, not_after: float | None = None) -> LaunchResult:
    """Submit the wrapper to Slurm as a batch job named by the namespace and identity, from the
    login host, as the login's user.

    Never twice: a job recorded in the workspace is adopted; so is one of this user's that squeue
    lists under the job's full name (a pass that died between sbatch and recording its id), and a
    workspace whose wrapper has already started is not submitted again whatever squeue says.
    runtime/slurm.json (the commands' environment and the job's name) is written first: the probe
    and terminate read it to reach the cluster. Secrets are held on the login host until the job
    starts (SECRETS_DELIVERER); runtime/secrets.pending tells the wrapper to wait for them."""
    job = spec.slurm
    name = slurm_job_name(spec.workspace, spec.identity)
    hold = _hold_secrets(t, spec)
    argv = job.sbatch_argv(name, spec.identity, spec.workspace)
    # What was asked of Slurm, for whoever reads the workspace (no secret is in it: names only).
    doc = shlex.quote(json.dumps({"env": job.env, "name": name, "sbatch": argv}, sort_keys=True))
    submit = " ".join(shlex.quote(a) for a in argv)
    deliver = (f"  [ -n \"$id\" ] && setsid sh -c {shlex.quote(SECRETS_DELIVERER)} deliver \"$PWD\" {shlex.quote(hold)} "
               "\"$id\" </dev/null >/dev/null 2>&1 &\n") if hold else ""
    script = (
        _in_workspace(spec) +
        "if [ -s runtime/slurm_job ]; then echo adopted; cat runtime/slurm_job; exit 0; fi\n"
        f"printf '%s\\n' {doc} > runtime/slurm.json\n"
        + env_lines(job.env) +
        f"id=$(squeue -h -t all -u \"$(id -un)\" -n {shlex.quote(name)} -o %i 2>/dev/null | sort -n | tail -n 1)\n"
        "how=adopted\n"
        "if [ -z \"$id\" ] && [ ! -e runtime/started_at ]; then\n"
        + _guard(spec, not_after)
        + ("  echo held > runtime/secrets.pending\n" if hold else "") +
        f"  out=$({submit} 2>&1) || {{ echo \"$out\" >&2; exit 3; }}\n"
        "  id=${out%%;*}; how=launched\n"
        + deliver +
        "fi\n"
        "date +%s > runtime/launched_at\n"
        "[ -n \"$id\" ] && echo \"$id\" > runtime/slurm_job.tmp && mv runtime/slurm_job.tmp runtime/slurm_job\n"
        "echo \"$how\"; echo \"$id\"\n"
    )
    r = None
    try:
        r = t.sh(script, timeout=60)
    finally:
        if hold and (r is None or r.rc != 0 or r.out.split()[:1] != ["launched"]):
            # No deliverer was started for them (adopted, refused, failed): the held secrets go now.
            t.sh(f"rm -rf {shlex.quote(hold)}", timeout=30)
    _refuse_wrong_spec(t, spec, r.rc, r.err)
    if r.rc == 3:
        _sbatch_refused(t, spec, r.err.strip())
    if r.rc != 0:
        raise TemporaryError(f"submitting to Slurm from {t.machine.name} failed (exit {r.rc}): {r.err.strip()[:300]}")
    lines = r.out.split()
    return LaunchResult(spec.identity, spec.workspace, adopted=lines[:1] == ["adopted"],
                        container=None, job=lines[1] if len(lines) > 1 else None)


def _sbatch_refused(t: Transport, spec: LaunchSpec, err: str) -> None:
    low = err.lower()
    # sbatch refuses what the cluster can never run (more GPUs than any node has, an unknown
    # partition or account); anything else (slurmctld down) may pass.
    if any(w in low for w in ("not available", "invalid partition", "invalid account", "invalid qos",
                              "invalid generic resource", "invalid gres", "unrecognized option",
                              "invalid option", "node count specification invalid", "invalid time limit",
                              "invalid signal")):
        _permanent(t, spec, f"Slurm refused {spec.identity}: {err[:300]}")
    raise TemporaryError(f"sbatch on {t.machine.name} failed: {err[:300]}")


def _launch_host(t: Transport, spec: LaunchSpec, not_after: float | None = None) -> LaunchResult:
    start = getattr(t, "start_host", None)  # this machine: the script below, in-process (local_launch.py)
    if start is not None:
        rc, err, done = start(spec, not_after)
        _refuse_wrong_spec(t, spec, rc, err)
        if rc != 0:
            raise TemporaryError(f"launch on {t.machine.name} failed (exit {rc}): {err.strip()[:300]}")
        return done
    ident = shlex.quote(spec.identity)
    script = (
        _in_workspace(spec) +
        "if [ -e runtime/launched_at ]; then echo adopted; cat runtime/pid 2>/dev/null; exit 0; fi\n"
        + launch_env_lines(spec.env) + _guard(spec, not_after) +
        "date +%s > runtime/launched_at\n"
        f"setsid sh scripts/launch.sh {ident} </dev/null >/dev/null 2>&1 &\n"
        f"{PID_WAIT}\n"
        "echo launched; cat runtime/pid 2>/dev/null\n"
    )
    r = t.sh(script, timeout=30)
    _refuse_wrong_spec(t, spec, r.rc, r.err)
    if r.rc != 0:
        raise TemporaryError(f"launch on {t.machine.name} failed (exit {r.rc}): {r.err.strip()[:300]}")
    lines = r.out.split()
    pid = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None
    return LaunchResult(spec.identity, spec.workspace, adopted=lines[:1] == ["adopted"], pid=pid)


def _launch_docker(t: Transport, spec: LaunchSpec, not_after: float | None = None) -> LaunchResult:
    ident = shlex.quote(spec.identity)
    args = [
        "docker", "run", "-d", "--name", spec.identity,
        "--label", f"reconciler.core.identity={spec.identity}", "--label", f"reconciler.run={spec.run_name}",
        "--network", spec.network, "-w", "/bundle",
    ]
    if not spec.pull:
        args.append("--pull=never")
    if spec.gpus:
        args += ["--gpus", f"device={','.join(str(g) for g in spec.gpus)}"]
    cmd = " ".join(shlex.quote(a) for a in args)
    cmd += ' --user "$(id -u):$(id -g)" -v "$PWD:/bundle"'
    for source, target in spec.mounts:  # paths without ':' or ',' (rentals/checkpoints.py container_view)
        cmd += " -v " + shlex.quote(f"{source}:{target}:ro")
    cmd += f" {shlex.quote(spec.image or '')} sh /bundle/scripts/launch.sh {ident}"
    dp = docker_prefix(t.machine)
    script = (
        _in_workspace(spec) +
        "if [ -e runtime/container ]; then echo adopted; exit 0; fi\n"
        + launch_env_lines(spec.env) + _guard(spec, not_after) +
        f"echo {ident} > runtime/container\n"
        "date +%s > runtime/launched_at\n"
        f"out=$({dp}{cmd} 2>&1); rc=$?\n"
        "if [ $rc -eq 0 ]; then echo launched; exit 0; fi\n"
        'case "$out" in *"already in use"*) echo adopted; exit 0;; esac\n'
        # Record the failure where observers look, so the instance reads as failed, not lost.
        'printf \'{"state": "failed", "exit_code": %d, "finished_ts": %s}\\n\' "$rc" "$(date +%s)" > runtime/result.json\n'
        'echo "$out" > runtime/launch.err; echo "$out" >&2; exit 3\n'
    )
    r = t.sh(script, timeout=120)
    _refuse_wrong_spec(t, spec, r.rc, r.err)
    if r.rc == 0:
        return LaunchResult(spec.identity, spec.workspace, adopted=r.out.strip() == "adopted", container=spec.identity)
    err = r.err.strip()
    low = err.lower()
    if "no such image" in low or "unable to find image" in low or "pull access denied" in low:
        how = "pulling is disabled by the template (launch_mode.pull: false)" if not spec.pull else "pull failed"
        _permanent(t, spec, f"image {spec.image!r} not found on {t.machine.name}; {how}", machine=True)
    if "conflict" in low and "already in use" in low:
        return LaunchResult(spec.identity, spec.workspace, adopted=True, container=spec.identity)
    if "could not select device driver" in low or "nvidia" in low and "gpu" in low:
        detail = next((line for line in err.splitlines() if "error" in line.lower()), err)[:200]
        _permanent(t, spec, f"docker on {t.machine.name} cannot give GPUs to containers: {detail}", machine=True)
    if r.rc == 97:
        raise TemporaryError(f"workspace {spec.workspace} missing on {t.machine.name}")
    raise TemporaryError(f"docker run on {t.machine.name} failed: {err[:300]}")


def _refuse_wrong_spec(t: Transport, spec: LaunchSpec, rc: int, err: str = "") -> None:
    if rc == LATE:  # retryable: the next pass observes the machine again and issues a fresh launch
        raise TemporaryError(f"{t.machine.name} refused to start {spec.identity}: it arrived after its deadline "
                             f"({err.strip()[:80]}; launch_ttl, docs/loop.md); the next pass launches it again")
    if rc == CLAIMED:
        raise TemporaryError(f"{spec.identity} on {t.machine.name} is claimed by a launch of another spec; "
                             "not starting it (the next pass numbers past it)")
    if rc == WRONG_SPEC:
        # Never start or adopt an instance under a spec it was not built from. The next pass sees
        # the workspace's own digest and gives the desired spec a generation of its own.
        raise TemporaryError(f"{spec.identity} on {t.machine.name} was built for another spec; not starting "
                             "or adopting it")


def _permanent(t: Transport, spec: LaunchSpec, message: str, machine: bool = False) -> None:
    """Record why the instance can never start in its result (later passes read the same reason and
    do not retry it), then raise. ``machine``: never on this machine, but another may take the run
    (planner/ruled_out.py): the launch is not the run's end, the next pass places it elsewhere."""
    doc = json.dumps({"state": "failed", "exit_code": 125, "finished_ts": int(time.time()), "message": message,
                      "permanent": True, **({"scope": "machine"} if machine else {})})
    t.sh(f"cd {shlex.quote(spec.workspace)} && printf '%s\\n' {shlex.quote(doc)} > runtime/result.json", timeout=30)
    raise (TemporaryError if machine else PermanentError)(message)


def terminate(t: Transport, identity: str, workspace: str, grace: float) -> dict:
    """Stop the instance; the machine's answer passes the trust boundary (its error bounded text)."""
    return parse_stop(t.agent({"op": "terminate", "workspace": workspace, "identity": identity, "grace": grace}))


def finish(t: Transport, workspace: str, remove: bool) -> dict:
    return parse_stop(t.agent({"op": "finish", "workspace": workspace, "remove": remove}))
