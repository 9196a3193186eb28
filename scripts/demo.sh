#!/usr/bin/env bash
# Set up the reconciler and run it on this machine, the embedded default: no cloud account, no
# other machine. It installs the reconciler into .venv, copies the repository's examples into a
# fresh git repository (DEMO_DIR, default .reconciler/demo), and reconciles it until the example
# runs have finished: you see the plan, a real process, a machine rented from the local provider
# (a real sshd on loopback) from provisioning to its return, and the status commits left in git.
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

rental=yes
if [[ ! -x /usr/sbin/sshd ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null; then
        echo "== installing openssh-server (the local provider's rentals are sshd servers)"
        apt-get install -y -qq openssh-server > /dev/null 2>&1 || rental=no
    else
        rental=no
    fi
fi

rm -rf "$demo"
mkdir -p "$demo"
cp -r specs execution_templates schemas examples "$demo/"
cd "$demo"
if [[ $rental == no ]]; then
    echo "(no /usr/sbin/sshd here: the rental example is left out; install openssh-server to see it)"
    rm -f specs/runs/hello-rental.yaml
fi
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
ended() {
    case "$(sed -n 's/^phase: //p' "status/$1.yaml" 2>/dev/null || true)" in Succeeded|Failed) return 0 ;; esac
    return 1
}
for pass in $(seq 1 15); do
    echo
    echo "== reconcile --once (pass $pass)"
    reconcile --once
    if ended hello && { [[ $rental == no ]] || { ended hello-rental && [[ $(reconcile rentals --json |
            python3 -c 'import json,sys; print(len(json.load(sys.stdin)["rentals"]))') == 0 ]]; }; }; then
        break
    fi
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
if [[ $rental == yes ]]; then
    echo
    echo "== the rented run: its output (collected before the rental went back), its cost and conditions"
    cat .reconciler/bundles/hello-rental-g1-a*/artifacts/stdout.log
    sed -n '/^cost:/,/^conditions:/p' status/hello-rental.yaml | sed '$d'
    grep -A2 -E 'type: (Provisioned|SshReady|GpuVerified)$' status/hello-rental.yaml | grep -E 'type|status' | paste - -
    echo
    echo "== reconcile rentals (the rental is gone: given back once its run was collected)"
    reconcile rentals
fi
echo
echo "Demo repository: $demo"
