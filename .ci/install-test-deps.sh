#!/usr/bin/env bash
# Install the system packages the real-part tests need (tests/infra): an sshd to log in to over
# loopback, a docker daemon the tests start themselves (no bridge, vfs storage), and a static busybox
# to build a tiny container image with `docker import` (no registry is reachable from CI).
#
# Idempotent: installs only what is missing. Run as root on Debian 12.
set -euo pipefail

missing=()
test -x /usr/sbin/sshd || missing+=(openssh-server)
{ command -v dockerd >/dev/null && command -v docker >/dev/null; } || missing+=(docker.io)
test -x /bin/busybox || missing+=(busybox-static)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)

if ((${#missing[@]})); then
    echo "install-test-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# sshd refuses to start (as root) without its privilege-separation directory.
mkdir -p /run/sshd
echo "install-test-deps: ok"
