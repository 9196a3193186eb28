"""The package as users get it: a wheel built from the files git has, installed into a clean
virtualenv (its dependencies from the package index), run from outside this checkout.

pip shows nothing of what the build backend warns, even with -v, so the metadata is also prepared
by setuptools itself, in an environment with exactly the [build-system] requirements, under
``-W error``: a deprecated setting (the license as a table, a License classifier next to an SPDX
expression) fails the test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import reconciler
from tests.spec.helpers import TEMPLATE, run_text, write

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input"]


def sh(*cmd, cwd: Path | None = None, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def clean_env(venv: Path) -> dict:
    """No PYTHONPATH, no virtualenv of ours: only what the installed package brings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The files git tracks, or would (untracked, not ignored): what a clone has, and nothing built."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    src = tmp_path_factory.mktemp("pkg") / "src"
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path) -> Path:
    dist = source.parent / "dist"
    sh(sys.executable, *PIP, "wheel", "--no-deps", "--wheel-dir", dist, source, timeout=300)
    [whl] = dist.glob("gpu_reconciler-*.whl")
    return whl


def test_build_requirements_prepare_the_metadata_without_warnings(source: Path) -> None:
    requires = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in requires), requires  # PEP 639's license
    env_dir = source.parent / "build-env"
    sh(sys.executable, "-m", "venv", env_dir)
    py = env_dir / "bin" / "python"
    sh(py, *PIP, "install", "--quiet", *requires)
    out = source.parent / "metadata"
    out.mkdir()
    r = sh(py, "-W", "error", "-c", "import sys; from setuptools import build_meta as b; "
           "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", out, cwd=source, env=clean_env(env_dir))
    assert "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    meta = (out / r.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0\n" in meta and "License-File: LICENSE\n" in meta


def test_wheel_carries_the_license_metadata_and_version(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        info = f"gpu_reconciler-{reconciler.__version__}.dist-info"
        meta = z.read(f"{info}/METADATA").decode()
        license_text = z.read(f"{info}/licenses/LICENSE")
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert f"Version: {reconciler.__version__}\n" in meta
    assert "License-Expression: Apache-2.0\n" in meta and "Classifier: License ::" not in meta
    assert "Requires-Dist: argcomplete" in meta and "Classifier: Programming Language :: Python :: 3\n" in meta
    assert license_text == (REPO / "LICENSE").read_bytes()
    # The Apache License 2.0 as published (apache.org/licenses/LICENSE-2.0.txt), not a paraphrase.
    assert hashlib.sha256(license_text).hexdigest() == \
        "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
    assert "reconcile = reconciler.cli.main:main" in entry_points


def test_installed_wheel_runs_version_validate_and_completion(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    sh(venv / "bin" / "python", *PIP, "install", "--quiet", wheel, timeout=300)
    env = clean_env(venv)
    exe = venv / "bin" / "reconcile"
    where = sh(venv / "bin" / "python", "-c", "import reconciler; print(reconciler.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # not this checkout

    r = sh(exe, "--version", cwd=tmp_path, env=env)
    assert r.stdout == f"reconcile {reconciler.__version__}\n"

    repo = tmp_path / "repo"
    write(repo, "execution_templates/local-host.yaml", TEMPLATE)
    write(repo, "specs/runs/hello.yaml", run_text("hello"))
    r = sh(exe, "validate", cwd=repo, env=env)
    assert r.stdout.strip() == "ok: 2 file(s) valid"
    write(repo, "specs/runs/bad.yaml", run_text("bad", template="nowhere"))
    bad = subprocess.run([exe, "validate", "--repo", repo], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "specs/runs/bad.yaml:6:3: spec.template: template 'nowhere' not found" in bad.stdout
    assert "Traceback" not in bad.stdout + bad.stderr

    script = 'eval "$(reconcile completion bash)"; COMP_LINE="reconcile va"; COMP_POINT=12; ' \
             'COMP_WORDS=(reconcile va); COMP_CWORD=1; _python_argcomplete reconcile va reconcile 2>/dev/null; ' \
             'printf "reply:%s\\n" "${COMPREPLY[@]}"'
    r = sh("bash", "--norc", "-c", script, cwd=tmp_path, env=env)
    assert r.stdout.splitlines() == ["reply:validate "]
