#!/bin/sh
# The launch wrapper: runs a bundle's entrypoint and leaves a record on every exit.
#
#   sh scripts/launch.sh IDENTITY        (started in its own session by the reconciler)
#
# Why a wrapper: the reconciler is not the job's parent (it may crash, restart, or live on another
# host), so the job's fate must be written where any later observer can read it. This script
#   - records its pid (it leads the session and the process group: killing the group kills all),
#   - refreshes runtime/heartbeat while the job lives,
#   - always writes runtime/result.json {state, exit_code, finished_at}: on success, failure and
#     SIGTERM (state "terminated"),
#   - reads the launch-time secrets file once and deletes it, so secrets never stay on disk.
# POSIX sh only: it also runs inside minimal containers (busybox) that have no python.

ident="$1"
cd "$(dirname "$0")/.." || exit 111
bundle=$(pwd)
mkdir -p runtime artifacts
log() { echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $*" >> runtime/runtime.log; }

echo "$$" > runtime/pid.tmp && mv runtime/pid.tmp runtime/pid
date +%s > runtime/started_at

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

# Data parallel on this machine (env.sh sets NPROC_PER_NODE for a run of several GPUs): a free
# loopback port for torchrun's rendezvous, chosen here, at launch, where it is free. Without a
# python the launcher's own default applies.
py="${RECONCILER_PYTHON:-}"
if [ -z "$py" ]; then py=$(command -v python3 2>/dev/null); fi
if [ -n "${NPROC_PER_NODE:-}" ] && [ -z "${MASTER_PORT:-}" ] && [ -n "$py" ]; then
    MASTER_PORT=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null) \
        && export MASTER_PORT || unset MASTER_PORT
fi

child=""
hb=""
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
    [ -n "$sampler" ] && kill -TERM "$sampler" 2>/dev/null
}

on_term() {
    log "signal received; stopping the job"
    [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
    [ -n "$child" ] && wait "$child" 2>/dev/null
    stop_helpers
    finish terminated 143
    exit 143
}
trap on_term TERM INT HUP

log "launch $ident in $bundle"

# GPU telemetry, when the execution plane has a python; it exits by itself when this script dies.
if [ -n "$py" ] && [ -f scripts/gpu_sampler.py ] && [ "${RECONCILER_GPU_SAMPLER:-1}" != "0" ]; then
    "$py" scripts/gpu_sampler.py --out artifacts/nvml-audit.jsonl --interval "${RECONCILER_SAMPLE_INTERVAL:-1}" \
        --watch-pid $$ </dev/null >>runtime/runtime.log 2>&1 &
    sampler=$!
fi

sh scripts/entrypoint.sh </dev/null >>artifacts/stdout.log 2>>artifacts/stderr.log &
child=$!
echo "$child" > runtime/child.pid

(
    while kill -0 "$child" 2>/dev/null; do
        date +%s > runtime/heartbeat.tmp && mv runtime/heartbeat.tmp runtime/heartbeat
        sleep "${RECONCILER_HEARTBEAT_SECONDS:-2}"
    done
) </dev/null >/dev/null 2>&1 &
hb=$!

wait "$child"
code=$?
stop_helpers
if [ "$code" -eq 0 ]; then
    finish succeeded 0
else
    finish failed "$code"
fi
exit "$code"
