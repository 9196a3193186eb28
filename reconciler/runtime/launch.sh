#!/bin/sh
# The launch wrapper: runs a bundle's entrypoint and leaves a record on every exit.
#
#   sh scripts/launch.sh IDENTITY        (started in its own session by the reconciler)
#
# Why a wrapper: the reconciler is not the job's parent (it may crash, restart, or live on another
# host), so the job's fate must be written where any later observer can read it. This script
#   - records its pid (it leads the session and the process group: killing the group kills all),
#   - refreshes runtime/heartbeat from its start until the job has ended,
#   - always writes runtime/result.json {state, exit_code, finished_at}: on success, failure and
#     SIGTERM (state "terminated"),
#   - reads the launch-time secrets file once and deletes it, so secrets never stay on disk.
# Its environment is what the reconciler gives it (on this machine: a small base, never the
# reconciler's own; over SSH: the login's), then the run's secrets, scripts/env.sh and
# runtime/launch.env: a run sees its own declared variables and granted secrets, no others.
# POSIX sh only: it also runs inside minimal containers (busybox) that have no python.

ident="$1"
# Nothing before the pid below starts a process that a builtin can replace: the time from the
# launch to a visible pid is the launch's latency (a spec edit to its process).
case "$0" in */*) here="${0%/*}" ;; *) here=. ;; esac
cd "$here/.." || exit 111
bundle=$PWD
[ -d runtime ] && [ -d artifacts ] || mkdir -p runtime artifacts
log() { echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $*" >> runtime/runtime.log; }

# The heartbeat says the wrapper's process group is not frozen (a stopped group, a machine out of
# CPU). It beats from the wrapper's start, before the pid is visible, and through everything
# before the job (a secrets wait, a resume fetch of many gigabytes): a group stopped at any moment
# of its life is seen, and a long fetch is never taken for a freeze. It is in this process group,
# so stopping the group stops it; it ends with this wrapper ($$ is the wrapper in a subshell too).
# A beat is the file's modification time (all the probe reads), set by a builtin: no process.
: > runtime/heartbeat
(
    while kill -0 $$ 2>/dev/null; do
        sleep "${RECONCILER_HEARTBEAT_SECONDS:-2}"
        : > runtime/heartbeat
    done
) </dev/null >/dev/null 2>&1 &
hb=$!
echo "$$" > runtime/pid.tmp && mv runtime/pid.tmp runtime/pid
date +%s > runtime/started_at

# Under Slurm the secrets wait on the login host while the job is queued, and are delivered only
# once this wrapper has started (runtime/secrets.pending says so): wait for them, for a while.
if [ -f runtime/secrets.pending ]; then
    i=0
    while [ ! -f runtime/secrets.env ] && [ "$i" -lt $((${RECONCILER_SECRETS_WAIT:-120} * 5)) ]; do
        sleep 0.2; i=$((i+1))
    done
    rm -f runtime/secrets.pending
    if [ ! -f runtime/secrets.env ]; then
        printf '{"state": "failed", "exit_code": 126, "finished_ts": %s, "message": "%s"}\n' "$(date +%s)" \
            "the secrets were not delivered from the login host" > runtime/result.json.tmp
        mv runtime/result.json.tmp runtime/result.json
        kill "$hb" 2>/dev/null
        exit 126
    fi
fi

# Object storage (docs/storage.md): the remote's configuration and credentials are read once into
# a variable that is never exported, handed to scripts/storage_sync.py on its stdin, and deleted.
# The control plane writes it before secrets.env, so after the wait above it is there.
store_env=""
if [ -f runtime/storage.env ]; then
    store_env=$(cat runtime/storage.env)
    rm -f runtime/storage.env
fi

if [ -f runtime/secrets.env ]; then
    set -a
    . ./runtime/secrets.env
    set +a
    rm -f runtime/secrets.env
fi
RECONCILER_IDENTITY="$ident"
RECONCILER_BUNDLE="$bundle"
export RECONCILER_IDENTITY RECONCILER_BUNDLE
[ -f scripts/env.sh ] && . ./scripts/env.sh
# What only the launch could know (a node's rank and its run's rendezvous): written by the launcher.
[ -f runtime/launch.env ] && . ./runtime/launch.env

# A run across several machines under Slurm (env.sh sets RECONCILER_NODES): this wrapper runs on
# the allocation's first node, which is the rendezvous (MASTER_ADDR: its address as Slurm knows
# it); srun starts one copy of the entrypoint per node below, each with its NODE_RANK.
multi=""
if [ "${RECONCILER_NODES:-1}" -gt 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    multi=1
    first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
    addr=$(scontrol -o show node "$first" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    MASTER_ADDR="${addr:-$first}"
    export MASTER_ADDR
fi

# Data parallel (env.sh sets NPROC_PER_NODE for a run of several GPUs or machines): a free port
# for torchrun's rendezvous, chosen here, at launch, on the rendezvous machine, where it is free.
# Without a python the launcher's own default applies.
py="${RECONCILER_PYTHON:-}"
if [ -z "$py" ]; then py=$(command -v python3 2>/dev/null); fi
if [ -n "${NPROC_PER_NODE:-}" ] && [ -z "${MASTER_PORT:-}" ] && [ -n "$py" ]; then
    MASTER_PORT=$("$py" -c 'import os, socket; s = socket.socket(); s.bind((os.environ.get("MASTER_ADDR") or "127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null) \
        && export MASTER_PORT || unset MASTER_PORT
fi

child=""
sampler=""

finish() {
    # $1 state, $2 exit code. Written to a temporary name and renamed: readers never see half a file.
    printf '{"state": "%s", "exit_code": %s, "finished_at": "%s", "finished_ts": %s}\n' \
        "$1" "$2" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(date +%s)" > runtime/result.json.tmp
    mv runtime/result.json.tmp runtime/result.json
    log "finished state=$1 exit_code=$2"
}

stop_helpers() {
    [ -n "$hb" ] && kill "$hb" 2>/dev/null
    [ -n "$stamper" ] && kill -TERM "$stamper" 2>/dev/null  # it takes a last look, then exits
    [ -n "$sampler" ] && kill -TERM "$sampler" 2>/dev/null
}

on_term() {
    [ -n "$syncer" ] && kill -TERM "$syncer" 2>/dev/null  # a terminate ends uploads too
    [ -n "$job_done" ] && exit "$code"  # the result is written: only the final upload was cut
    log "signal received; stopping the job"
    [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
    [ -n "$child" ] && wait "$child" 2>/dev/null
    stop_helpers
    finish terminated 143
    exit 143
}
trap on_term TERM INT HUP
# Slurm's warning before the time limit (sbatch --signal=B:<sig>@<seconds>) reaches only this
# shell: pass it on to the job, which saves a checkpoint on it.
forward() {
    log "SIG$1 received; passing it to the job"
    [ -n "$child" ] && kill "-$1" "$child" 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward USR2' USR2

log "launch $ident in $bundle"

# Object storage: resume from the bucket before the job starts, upload beside it while it runs.
# The sync program gets the base environment and the attempt's identity and workspace (a stop finds
# it; an attempt whose upload still runs is not taken for over), never the job's secrets; printf is a builtin, so
# the credentials are on no command line.
syncer=""
job_done=""
if [ -f scripts/storage.json ] && [ -z "$py" ]; then
    log "storage: no python3 here; nothing is uploaded"
elif [ -f scripts/storage.json ]; then
    printf '%s\n' "$store_env" | env -i PATH="$PATH" HOME="${HOME:-/}" RECONCILER_IDENTITY="$ident" RECONCILER_BUNDLE="$bundle" \
        "$py" scripts/storage_sync.py fetch >>runtime/runtime.log 2>&1
    code=$?
    if [ "$code" -ne 0 ]; then  # storage_sync.py wrote result.json with the reason
        log "storage: the job does not start (fetch exit $code)"
        # A fetch that died before it could say why (a crash, a kill) still ends the attempt
        # with a result: never a run that looks lost.
        [ -f runtime/result.json ] || finish failed "$code"
        kill "$hb" 2>/dev/null
        exit "$code"
    fi
    printf '%s\n' "$store_env" | env -i PATH="$PATH" HOME="${HOME:-/}" RECONCILER_IDENTITY="$ident" RECONCILER_BUNDLE="$bundle" \
        RECONCILER_STORAGE_FINAL_SECONDS="${RECONCILER_STORAGE_FINAL_SECONDS:-1800}" \
        "$py" scripts/storage_sync.py watch . $$ >>runtime/runtime.log 2>&1 &
    syncer=$!
fi
store_env=""

# GPU telemetry, when the execution plane has a python; it exits by itself when this script dies.
if [ -n "$py" ] && [ -f scripts/gpu_sampler.py ] && [ "${RECONCILER_GPU_SAMPLER:-1}" != "0" ]; then
    "$py" scripts/gpu_sampler.py --out artifacts/nvml-audit.jsonl --interval "${RECONCILER_SAMPLE_INTERVAL:-1}" \
        --watch-pid $$ </dev/null >>runtime/runtime.log 2>&1 &
    sampler=$!
fi

# When each line of stdout and stderr was written (docs/cli.md, "Logs: interleaved"): a watcher
# of the two files' sizes, never between the job and its files, so its end cannot stop the job.
# -S: it needs only the standard library, so no site-packages at each launch (the interpreter's
# start is most of its cost: 28 ms of CPU against 65 ms with site on the reference VM).
stamper=""
if [ -n "$py" ] && [ -f scripts/log_stamp.py ]; then
    [ -e artifacts/logs.index ] || printf '# reconciler log index v1\n' > artifacts/logs.index
    "$py" -S scripts/log_stamp.py --index artifacts/logs.index --stdout artifacts/stdout.log \
        --stderr artifacts/stderr.log --watch-pid $$ </dev/null >>runtime/runtime.log 2>&1 &
    stamper=$!
fi

if [ -n "$multi" ]; then
    # One task per node; a task that fails ends the others (--kill-on-bad-exit), and scancel or
    # this wrapper's SIGTERM reaches every one of them. Output lines carry their node's rank.
    # --export=ALL: the job was submitted with only the base environment (SLURM_EXPORT_ENV says
    # so, and srun would follow it); each node's task needs this wrapper's, the run's own
    # variables and secrets, which go to the nodes with the step, never into the saved job state.
    # Each task writes runtime/rank-N.exit (its code and time; the workspace is on the shared file
    # system): the probe names the rank that failed first, where srun's own code says only 143.
    srun --export=ALL --nodes="$RECONCILER_NODES" --ntasks="$RECONCILER_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
        --label sh -c 'NODE_RANK=$SLURM_NODEID; export NODE_RANK; trap : USR1 USR2; sh scripts/entrypoint.sh; c=$?
            echo "$c $(date +%s)" > "runtime/rank-$NODE_RANK.exit"; exit $c' \
        </dev/null >>artifacts/stdout.log 2>>artifacts/stderr.log &
else
    sh scripts/entrypoint.sh </dev/null >>artifacts/stdout.log 2>>artifacts/stderr.log &
fi
child=$!
echo "$child" > runtime/child.pid

# A forwarded signal interrupts wait while the job lives on: wait again until it has ended.
while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break
done
stop_helpers
if [ "$code" -eq 0 ]; then
    finish succeeded 0
else
    finish failed "$code"
fi
# The last checkpoint and the artifacts go up before the wrapper exits (storage_sync.py bounds it).
job_done=1
while [ -n "$syncer" ] && kill -0 "$syncer" 2>/dev/null; do wait "$syncer"; done
exit "$code"
