#!/usr/bin/env bash
# Set up the reconciler and run it on this machine, the embedded default: no cloud account, no
# other machine. It installs the reconciler into .venv, copies the repository's examples into a
# fresh git repository (DEMO_DIR, default .reconciler/demo), and reconciles it until the example
# run has finished: you see the plan, a real process, and the status commits it leaves in git.
#
#   bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
demo=${DEMO_DIR:-$top/.reconciler/demo}

if [[ ! -x .venv/bin/reconcile ]]; then
    echo "== installing the reconciler into .venv (log: .venv/install.log)"
    python3 -m venv .venv
    .venv/bin/python -m pip install --disable-pip-version-check -e . > .venv/install.log 2>&1 ||
        { tail -n 20 .venv/install.log; exit 1; }
fi
export PATH="$top/.venv/bin:$PATH"

rm -rf "$demo"
mkdir -p "$demo"
cp -r specs execution_templates schemas examples "$demo/"
cd "$demo"
git init -q -b main
git config user.name "Demo User"
git config user.email "demo@example.invalid"
printf '.reconciler/\n' > .gitignore
git add -A
git commit -q -m "Example specs"
export RECONCILER_WORKSPACE_ROOT="$demo/.reconciler/workspaces"

echo "== reconcile validate"
reconcile validate
echo
echo "== reconcile plan"
reconcile plan
for pass in 1 2 3 4 5 6 7 8 9 10; do
    echo
    echo "== reconcile --once (pass $pass)"
    reconcile --once
    phase=$(sed -n 's/^phase: //p' status/hello.yaml 2>/dev/null || true)
    case "$phase" in Succeeded|Failed) break ;; esac
    sleep 1
done
echo
echo "== reconcile status"
reconcile status
echo
echo "== git log (the reconciler's status commits)"
git log --format='%h %an: %s' -5
echo
echo "== the run's output ($(sed -n 's/^  workspace: //p' status/hello.yaml))"
cat "$(sed -n 's/^  workspace: //p' status/hello.yaml)/artifacts/stdout.log"
echo
echo "Demo repository: $demo"
