#!/usr/bin/env bash
# Build the ms-swift environment of the execution plane: a separate virtualenv (about 2 GB) holding
# torch (CPU wheel), ms-swift, nvidia-ml-py and tokenizers. The control plane never imports swift, so
# this stays apart from the reconciler's own environment; the e2e tests point RECONCILER_SWIFT_PYTHON
# at VENV_DIR/bin/python.
#
#   .ci/install-swift.sh VENV_DIR
#
# Idempotent: if VENV_DIR/bin/swift exists and VENV_DIR/bin/python imports the pinned ms-swift (and
# pynvml, tokenizers), it does nothing; otherwise it (re)installs, which pip makes quick for whatever is
# already there. torch==2.13.0 resolves to the +cpu wheel kept on the machines' disk (pip's find-links);
# installing it first stops ms-swift's dependencies from pulling a CUDA build.
set -euo pipefail

TORCH_VERSION=2.13.0
SWIFT_VERSION=4.6.0

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
venv=$1
t0=$SECONDS

if [[ -x "$venv/bin/swift" ]] &&
    "$venv/bin/python" -c "import sys, swift, pynvml, tokenizers; sys.exit(swift.__version__ != '$SWIFT_VERSION')" 2>/dev/null; then
    echo "install-swift: ms-swift $SWIFT_VERSION already in $venv"
    exit 0
fi

python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)

"${pip[@]}" "torch==$TORCH_VERSION"
echo "install-swift: torch $TORCH_VERSION in $((SECONDS - t0))s"

"${pip[@]}" "ms-swift==$SWIFT_VERSION" nvidia-ml-py tokenizers
"$venv/bin/python" -c "import swift, torch; print(f'install-swift: ms-swift {swift.__version__}, torch {torch.__version__}')"
echo "install-swift: done in $((SECONDS - t0))s ($venv)"
