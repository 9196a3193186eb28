"""The transfer boundary: what comes from a machine (a tar stream, a checkpoint path, a folder a job
wrote) and what a committed link points at never reaches a path of the reconciler host outside the
place it is copied to.

Real parts: tar streams built with tarfile, real sshd logins (users ``rcxfer*`` whose PATH starts
with a folder the job can write, as on many machines), the local provider's sshd rentals and real
passes over a real git repository.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest

from reconciler.artifacts import bundle as bundles
from reconciler.rentals import checkpoints
from reconciler.artifacts import safetar
from reconciler.machines.base import MachineInfo
from reconciler.machines.ssh import SshTransport
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.spec.checks.inputs import input_problem
from reconciler.spec.models.fleet import Machine
from tests.rentals.conftest import RentalWorld, provider_doc
from tests.world import World, git, run_spec

STEPS = "abcdefghijklmnop"
LONG = "d" * 247


# ---------------------------------------------------------------- hostile streams


def _add(tar: tarfile.TarFile, name: str, type_=tarfile.REGTYPE, linkname: str = "", data: bytes = b"",
         mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type_, linkname, mode
    info.size = len(data) if type_ == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)


def cve_2025_4517(prefix: str, escape_to: str, writes: dict[str, bytes], overwrite: str | None = None) -> bytes:
    """A tar stream in the shape of CVE-2025-4517's proof of concept: folders with 247-character
    names and a chain of 16 symbolic links, so that the path a link resolves to is longer than
    PATH_MAX and os.path.realpath stops resolving (tarfile's data filter then judges the rest
    lexically, as inside the destination); a last link back up to ``prefix``; ``escape``, a link
    through the chain to ``escape_to`` (relative to ``prefix``, i.e. outside); then files written
    through ``escape`` (``writes``) and, with ``overwrite``, a hard link to ``escape/<overwrite>``
    whose content is replaced by a later member."""
    pre = f"{prefix}/" if prefix else ""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if prefix:
            _add(tar, prefix, tarfile.DIRTYPE, mode=0o755)
        path = ""
        for s in STEPS:
            _add(tar, pre + os.path.join(path, LONG), tarfile.DIRTYPE, mode=0o755)
            _add(tar, pre + os.path.join(path, s), tarfile.SYMTYPE, linkname=LONG)
            path = os.path.join(path, LONG)
        chain = os.path.join(*STEPS, "l" * 254)
        _add(tar, pre + chain, tarfile.SYMTYPE, linkname="../" * len(STEPS))
        _add(tar, pre + "escape", tarfile.SYMTYPE, linkname=f"{chain}/{escape_to}")
        if overwrite:
            _add(tar, pre + "flaglink", tarfile.LNKTYPE, linkname=f"{pre}escape/{overwrite}")
            _add(tar, pre + "flaglink", data=b"overwritten through a hard link\n")
        for name, data in writes.items():
            _add(tar, f"{pre}escape/{name}", data=data, mode=0o755)
    return buf.getvalue()


def _fixed_python() -> bool | None:
    """Whether this Python's tarfile has the CVE-2025-4517 fix (None: no data filter at all)."""
    if not hasattr(tarfile, "data_filter"):
        return None
    v = sys.version_info[:3]
    fixed = {(3, 11): (3, 11, 13), (3, 12): (3, 12, 11), (3, 13): (3, 13, 4)}.get(v[:2])
    return v >= fixed if fixed else v[:2] > (3, 13)


def _sentinel(base: Path) -> tuple[Path, Path]:
    dest, outside = base / "dest", base / "outside"
    dest.mkdir(parents=True)
    outside.mkdir()
    (outside / "flag").write_text("original\n")
    return dest, outside


def _links_or_shared_inodes(root: Path) -> list[str]:
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                bad.append(str(p))
            elif stat.S_ISREG(st.st_mode) and st.st_nlink != 1:
                bad.append(str(p))
    return bad


@pytest.fixture(params=["stream", "spool"])
def as_stream(request):
    """The bytes as a pipe-like stream (read in order) or as a spool on disk (what collection
    reads: tarfile seeks over the data, and the kernel copies it), so both ways are held to the
    same rules."""
    opened = []

    def make(data: bytes):
        if request.param == "stream":
            return io.BytesIO(data)
        f = tempfile.TemporaryFile()
        f.write(data)
        f.seek(0)
        opened.append(f)
        return f

    yield make
    for f in opened:
        f.close()


def test_the_cve_2025_4517_chain_writes_nothing_outside_the_destination(as_stream, tmp_path):
    dest, outside = _sentinel(tmp_path)
    stream = cve_2025_4517("", "../outside", {"planted": b"#!/bin/sh\necho pwned\n"}, overwrite="flag")
    res = safetar.unpack(as_stream(stream), dest)
    assert (outside / "flag").read_text() == "original\n"
    assert sorted(os.listdir(outside)) == ["flag"]
    assert _links_or_shared_inodes(dest) == []
    reasons = dict(res.skipped)
    assert reasons["escape"].startswith("a symbolic link to ")
    assert reasons["flaglink"] == "a hard link to escape/flag"
    [chain] = [n for n in reasons if n.startswith("a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/lll")]
    assert reasons[chain] == "a symbolic link to " + "../" * len(STEPS)
    # What is written is plain and inside: "escape" became an ordinary folder of dest, "flaglink"
    # an ordinary file.
    assert res.files == 2
    assert (dest / "escape" / "planted").is_file() and not (dest / "escape").is_symlink()
    assert (dest / "flaglink").read_bytes() == b"overwritten through a hard link\n"
    assert res.complete and not res.error and not res.truncated


def test_this_python_s_data_filter_is_or_is_not_bypassed_as_its_version_says(tmp_path):
    """The premise, checked on the Python that runs the tests: tarfile's data filter lets the chain
    write outside the destination exactly on the versions without the fix. The unpacker above is
    safe either way."""
    fixed = _fixed_python()
    if fixed is None:
        pytest.skip("this Python's tarfile has no extraction filters")
    dest, outside = _sentinel(tmp_path)
    stream = cve_2025_4517("", "../outside", {"planted": b"x\n"}, overwrite="flag")
    try:
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r|") as tar:
            tar.extractall(dest, filter="data")
    except tarfile.TarError:
        pass  # a fixed tarfile refuses the chain
    escaped = (outside / "flag").read_text() != "original\n" or (outside / "planted").exists()
    assert escaped == (not fixed), f"python {sys.version.split()[0]}: escaped={escaped}"


def _tar(members: list[tuple]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            _add(tar, *m)
    return buf.getvalue()


def test_names_types_and_links_already_in_the_destination(as_stream, tmp_path):
    dest, outside = _sentinel(tmp_path)
    # Left by an older reconciler: links where a file and a folder will be written.
    (dest / "artifacts").mkdir()
    (dest / "artifacts" / "log.txt").symlink_to(outside / "flag")
    (dest / "artifacts" / "sub").symlink_to(outside)
    stream = _tar([
        ("artifacts/log.txt", tarfile.REGTYPE, "", b"new log\n"),
        ("artifacts/sub/flag", tarfile.REGTYPE, "", b"through a link\n"),
        ("/etc/abs", tarfile.REGTYPE, "", b"x"),
        ("artifacts/../../up", tarfile.REGTYPE, "", b"x"),
        ("artifacts/./dot", tarfile.REGTYPE, "", b"x"),
        ("artifacts/ctl\x1b[2J", tarfile.REGTYPE, "", b"x"),
        ("artifacts/pipe", tarfile.FIFOTYPE),
        ("artifacts/dev", tarfile.CHRTYPE),
        ("artifacts/ok.bin", tarfile.REGTYPE, "", b"ok"),
    ])
    res = safetar.unpack(as_stream(stream), dest)
    assert (outside / "flag").read_text() == "original\n" and sorted(os.listdir(outside)) == ["flag"]
    assert (dest / "artifacts" / "log.txt").read_text() == "new log\n"  # the link was replaced, not followed
    assert not (dest / "artifacts" / "log.txt").is_symlink()
    assert (dest / "artifacts" / "sub" / "flag").read_text() == "through a link\n"
    assert not (dest / "artifacts" / "sub").is_symlink()
    assert (dest / "artifacts" / "ok.bin").read_bytes() == b"ok"
    reasons = dict(res.skipped)
    assert reasons["/etc/abs"] == "an absolute name"
    assert "'..'" in reasons["artifacts/../../up"] and "'.'" in reasons["artifacts/./dot"]
    assert reasons["artifacts/ctl\\x1b[2J"] == "a control character in its name"
    assert reasons["artifacts/pipe"] == "a FIFO" and reasons["artifacts/dev"] == "a device"
    assert (res.files, res.skipped_total) == (3, 6)
    assert _links_or_shared_inodes(dest) == []


def test_limits_keep_what_fits_and_a_cut_stream_leaves_no_partial_file(as_stream, tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    stream = _tar([(f"artifacts/f{i}", tarfile.REGTYPE, "", b"x" * 100) for i in range(10)])
    res = safetar.unpack(as_stream(stream), dest, limits=safetar.Limits(max_bytes=350, max_files=100))
    assert res.truncated and res.files == 3 and res.bytes == 300
    assert "limit" in res.note()
    res = safetar.unpack(as_stream(stream), tmp_path / "d", limits=safetar.Limits(max_bytes=10 ** 6, max_files=4))
    assert res.truncated and res.files + res.dirs == 4
    cut = tmp_path / "cut"
    cut.mkdir()
    big = _tar([("artifacts/big", tarfile.REGTYPE, "", b"y" * 100_000)])
    res = safetar.unpack(as_stream(big[:40_000]), cut)
    assert res.error and not res.complete
    assert [p.name for p in (cut / "artifacts").iterdir()] == []  # no partial file, no temporary left


def test_a_local_workspace_is_copied_without_following_links_or_opening_fifos(tmp_path):
    src, outside = _sentinel(tmp_path)
    (src / "a").mkdir()
    (src / "a" / "ok.txt").write_text("ok")
    (src / "a" / "abs").symlink_to("/etc/passwd")
    (src / "a" / "dirlink").symlink_to(outside)
    os.mkfifo(src / "a" / "pipe")
    out = tmp_path / "out"
    out.mkdir()
    res = safetar.copy_tree(src / "a", out, prefix=("artifacts",))
    assert (out / "artifacts" / "ok.txt").read_text() == "ok"
    assert sorted(p.name for p in (out / "artifacts").iterdir()) == ["ok.txt"]
    assert dict(res.skipped) == {"artifacts/abs": "a symbolic link to /etc/passwd",
                                 "artifacts/dirlink": f"a symbolic link to {outside}", "artifacts/pipe": "a FIFO"}


# ---------------------------------------------------------------- a hostile machine over real sshd


def _user(prefix: str = "rcxfer") -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def _hostile_sshd(sshd_factory, user: str):
    """An sshd whose sessions get a PATH that starts with ~/bin, a folder the login (the job) can write."""
    server = sshd_factory(start=False, user=user)
    server.extra_config = f"SetEnv PATH={server.home}/bin:/usr/local/bin:/usr/bin:/bin"
    server._write_config(server.authorized_keys)
    return server.start()


def _machine(server, root: str) -> MachineInfo:
    endpoint = {"host": server.host, "port": server.port, "user": server.user,
                "identity_file": str(server.identity_file), "host_key": server.host_key}
    m = Machine.model_validate({"name": "hostile", "ssh": endpoint, "workspace_root": root})
    return MachineInfo("hostile", root, fleet_machine=m)


def _own(path: Path, user: str) -> None:
    import pwd

    pw = pwd.getpwnam(user)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            os.lchown(name, pw.pw_uid, pw.pw_gid)


def _userdel(user: str) -> None:
    subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
    subprocess.run(["userdel", "-r", "-f", user], capture_output=True)


class _Hostile:
    """A login on a hostile sshd, its home and a workspace root it owns; cleaned up by the fixture."""

    def __init__(self, server, user: str):
        self.server, self.user = server, user
        self.home = Path(server.home)
        self.root = Path(f"/tmp/rcxfer-ws-{uuid.uuid4().hex[:8]}")

    def own(self) -> None:
        for path in (self.home, self.root):
            _own(path, self.user)

    @contextlib.contextmanager
    def transport(self, **kwargs):
        t = SshTransport(_machine(self.server, str(self.root)), **kwargs)
        try:
            yield t
        finally:
            t.close()


@pytest.fixture
def hostile(sshd_factory):
    user = _user()
    h = None
    try:
        h = _Hostile(_hostile_sshd(sshd_factory, user), user)
        yield h
    finally:
        if h is not None:
            shutil.rmtree(h.root, ignore_errors=True)
        _userdel(user)


def _tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in filenames:
            st = (Path(dirpath) / name).lstat()
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_machine_whose_tar_answers_with_the_cve_chain_cannot_plant_a_git_hook(tmp_path, hostile):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    marker = tmp_path / "hook-ran"
    hook = f"#!/bin/sh\ntouch {marker}\n".encode()
    identity = "evil-g1-a1"
    dest = repo / ".reconciler" / "bundles" / identity
    dest.mkdir(parents=True)
    # From dest/artifacts: up to the repository, then into .git/hooks.
    stream = cve_2025_4517("artifacts", "../../../../.git/hooks", {"reference-transaction": hook,
                                                                    "post-commit": hook})
    home, root = hostile.home, hostile.root
    (home / "bin").mkdir(exist_ok=True)
    (home / "evil.tar").write_bytes(stream)
    (home / "bin" / "tar").write_text(f"#!/bin/sh\n# the job's own tar\nexec cat {home}/evil.tar\n")
    (home / "bin" / "tar").chmod(0o755)
    (root / identity / "artifacts").mkdir(parents=True)
    (root / identity / "runtime").mkdir()
    hostile.own()
    before = _tree(repo, dest)
    hooks_before = sorted(os.listdir(repo / ".git" / "hooks"))
    with hostile.transport() as t:
        assert t.sh("command -v tar").out.strip() == f"{home}/bin/tar"  # the hostile tar is the one used
        res = t.fetch(identity, dest)
    assert sorted(os.listdir(repo / ".git" / "hooks")) == hooks_before
    assert _tree(repo, dest) == before  # nothing written in the repository outside the bundle
    assert _links_or_shared_inodes(dest) == []
    assert dict(res.skipped)["artifacts/escape"].startswith("a symbolic link to ")
    # The files meant for .git/hooks are plain files inside the bundle, and git runs no hook.
    assert (dest / "artifacts" / "escape" / "reference-transaction").is_file()
    git(repo, "commit", "-q", "--allow-empty", "-m", "after the collection")
    assert not marker.exists()


def test_an_endless_stream_stops_at_the_limit(tmp_path, hostile):
    home = hostile.home
    (home / "bin").mkdir(exist_ok=True)
    # A tar that never ends.
    (home / "bin" / "tar").write_text('#!/bin/sh\n[ "$1" = --version ] && exit 0\nexec cat /dev/zero\n')
    (home / "bin" / "tar").chmod(0o755)
    (hostile.root / "x-g1-a1").mkdir(parents=True)
    hostile.own()
    with hostile.transport(command_timeout=20) as t:
        res = t.fetch("x-g1-a1", tmp_path / "b", limits=safetar.Limits(max_bytes=1 << 20, max_files=10))
    assert res.truncated and res.files == 0


def test_tar_exit_1_counts_only_when_the_stream_is_whole(tmp_path, hostile):
    """GNU tar exits 1 when a file changed while it was read (a log still written): the stream is
    whole and the collection counts. A stream cut short with exit 1, or any exit 2, does not."""
    home = hostile.home
    (home / "bin").mkdir(exist_ok=True)
    whole = _tar([("artifacts/train.log", tarfile.REGTYPE, "", b"step 1\n" * 2000)])
    (home / "whole.tar").write_bytes(whole)
    tar = home / "bin" / "tar"
    (hostile.root / "x-g1-a1").mkdir(parents=True)
    _own(hostile.root, hostile.user)
    with hostile.transport() as t:
        for n, (body, ok) in enumerate([(f"cat {home}/whole.tar; exit 1", True),
                                        (f"head -c 3000 {home}/whole.tar; exit 1", False),
                                        (f"cat {home}/whole.tar; exit 2", False)]):
            tar.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exit 0\n{body}\n')
            tar.chmod(0o755)
            _own(home, hostile.user)
            dest = tmp_path / f"b{n}"
            if ok:
                res = t.fetch("x-g1-a1", dest)
                assert res.complete and (dest / "artifacts" / "train.log").read_bytes() == b"step 1\n" * 2000
            else:
                with pytest.raises(TemporaryError, match="exit"):
                    t.fetch("x-g1-a1", dest)


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_paths_from_the_machine_are_checked_and_copied_as_plain_files(tmp_path, hostile):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "first")
    head = (repo / ".git" / "HEAD").read_text()
    state = repo / ".reconciler"
    host_secret = tmp_path / "host-secret"
    host_secret.mkdir()
    (host_secret / "key").write_text("HOST SECRET\n")
    ws = hostile.root / "ck-g1-a1"
    out = ws / "artifacts" / "output"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "model.bin").write_bytes(b"weights")
    (out / "checkpoint-5" / "trainer_state.json").write_text("{}")
    # A relative link deep enough to leave the store once renamed into it, an absolute one,
    # and a checkpoint folder that is itself a link.
    (out / "checkpoint-5" / "deep").symlink_to("../" * 12 + str(host_secret).lstrip("/"))
    (out / "checkpoint-5" / "abs").symlink_to(host_secret)
    (out / "checkpoint-6").symlink_to("../" * 12 + str(host_secret).lstrip("/"))
    _own(hostile.root, hostile.user)
    with hostile.transport() as t:
        final = checkpoints.save(t, "ck-g1-a1", "artifacts/output/checkpoint-5", state, "ck", 1, None)
        assert final == checkpoints.folder(state, "ck", 1) / "checkpoint-5"
        assert sorted(p.name for p in final.iterdir()) == ["model.bin", "trainer_state.json"]
        with pytest.raises(TemporaryError, match="no such folder"):
            checkpoints.save(t, "ck-g1-a1", "artifacts/output/checkpoint-6", state, "ck", 1, None)
        for bad in (str(repo / ".git"), "/etc", "artifacts/output/../../../../.git", "artifacts/..",
                    "artifacts/output/checkpoint-5/../checkpoint-6", "artifacts/output/not-a-checkpoint"):
            with pytest.raises(TemporaryError, match="not copying checkpoint"):
                checkpoints.save(t, "ck-g1-a1", bad, state, "ck", 1, None)
    assert (repo / ".git" / "HEAD").read_text() == head and (repo / ".git" / "objects").is_dir()
    assert git(repo, "log", "--format=%s").strip() == "first"
    assert checkpoints.saved(state) == {("ck", 1): {"checkpoint-5"}}
    assert _links_or_shared_inodes(state) == []
    assert (host_secret / "key").read_text() == "HOST SECRET\n"


def test_a_poisoned_store_from_before_is_never_followed_when_a_checkpoint_is_staged(tmp_path):
    state = tmp_path / ".reconciler"
    host_secret = tmp_path / "host-secret"
    host_secret.mkdir()
    (host_secret / "key").write_text("HOST SECRET\n")
    g = checkpoints.folder(state, "ck", 1)
    (g / "checkpoint-5").mkdir(parents=True)
    (g / "checkpoint-5" / "model.bin").write_bytes(b"weights")
    (g / "checkpoint-5" / "leak").symlink_to(host_secret)
    (g / "checkpoint-5" / "deep").symlink_to("../" * 10 + str(host_secret).lstrip("/"))
    (g / "checkpoint-9").symlink_to(host_secret)  # newer, but a link: never a checkpoint
    assert checkpoints.saved(state) == {("ck", 1): {"checkpoint-5"}}
    saved = checkpoints.latest(state, "ck", 1)
    assert saved == g / "checkpoint-5"
    bundle = tmp_path / "bundle"
    (bundle / "inputs").mkdir(parents=True)
    res = checkpoints.stage(saved, bundle)
    staged = bundle / "inputs" / ".reconciler" / "resume" / "checkpoint-5"
    assert sorted(p.name for p in staged.iterdir()) == ["model.bin"]
    assert {n for n, _ in res.skipped} == {"inputs/.reconciler/resume/checkpoint-5/leak",
                                           "inputs/.reconciler/resume/checkpoint-5/deep"}
    assert not any(b"HOST SECRET" in p.read_bytes() for p in bundle.rglob("*") if p.is_file())
    res = checkpoints.stage(g / "checkpoint-9", bundle)
    assert res.files == 0 and not (bundle / "inputs" / ".reconciler" / "resume" / "checkpoint-9").exists()


def test_a_checkpoint_the_probe_reports_on_a_rental_is_copied_without_its_links(rental):
    """Through real passes: the probe reports the job's checkpoint, the pass copies it to the
    store, and what the job put in it besides plain files (links to host folders) stays behind."""
    import time

    w = rental()
    script = ("d=artifacts/output/checkpoint-3 && mkdir -p $d && echo w > $d/model.bin && ln -s /etc $d/leak"
              " && ln -s " + "../" * 12 + "etc $d/deep && echo {} > $d/trainer_state.json && sleep 30")
    w.add_run(run_spec("ck", "rental-host", ["sh", "-c", script]))
    rec = w.reconciler()
    store = checkpoints.folder(w.repo / ".reconciler", "ck", 1)
    deadline = time.monotonic() + 30
    while not (store / "checkpoint-3").is_dir():
        assert time.monotonic() < deadline, w.status("ck")
        rec.run_pass()
        time.sleep(0.2)
    assert sorted(p.name for p in (store / "checkpoint-3").iterdir()) == ["model.bin", "trainer_state.json"]
    assert _links_or_shared_inodes(w.repo / ".reconciler" / "checkpoints") == []
    w.add_run(run_spec("ck", "rental-host", ["sh", "-c", script], desiredState="Stopped"))
    w.until("ck", lambda s: s.phase == "Terminated" and not w.rentals(), timeout=30)


# ---------------------------------------------------------------- collection on a rental


@pytest.fixture
def rental(tmp_path):
    worlds = []

    def make(**spec) -> RentalWorld:
        w = RentalWorld(tmp_path / f"w{len(worlds)}", provider_doc(tmp_path / f"provider{len(worlds)}", **spec))
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.cleanup()


def test_fifos_and_links_in_artifacts_are_skipped_listed_and_the_rental_released(rental):
    w = rental()
    w.add_run(run_spec("arts", "rental-host", ["sh", "-c", "mkfifo artifacts/pipe && ln -s /etc/passwd artifacts/passwd"
                                               " && ln -s / artifacts/root && echo trained > artifacts/out.txt"]))
    st = w.until("arts", lambda s: s.phase == "Succeeded" and s.condition("ArtifactsComplete") is not None,
                 timeout=60)
    cond = st.condition("ArtifactsComplete")
    assert (cond.status, cond.reason) == ("False", "EntriesSkipped")
    assert "artifacts/pipe (a FIFO)" in cond.message
    assert "artifacts/passwd (a symbolic link to /etc/passwd)" in cond.message
    assert "artifacts/root (a symbolic link to /)" in cond.message
    b = w.bundle(st.handle.identity)
    assert (b / "artifacts" / "out.txt").read_text() == "trained\n"
    assert _links_or_shared_inodes(b) == []
    manifest = json.loads((b / "artifacts" / "manifest.json").read_text())
    assert {s["path"] for s in manifest["collection"]["skipped"]} == {"artifacts/pipe", "artifacts/passwd",
                                                                     "artifacts/root"}
    w.until("arts", lambda s: not w.rentals(), timeout=30)  # idle 0: given back once collected


def test_a_job_that_plants_its_own_tar_on_a_rental_cannot_reach_the_repository(rental):
    w = rental()
    Path("/tmp/rcxfer-hook-ran").unlink(missing_ok=True)
    identity = "planted-g1-a1"
    stream = cve_2025_4517("artifacts", "../../../../.git/hooks",
                           {"reference-transaction": b"#!/bin/sh\ntouch /tmp/rcxfer-hook-ran\n"})
    (w.repo / "evil.tar").write_bytes(stream)
    git(w.repo, "add", "evil.tar")
    # The job puts a tar of its own first on its login's PATH (~/.rc-rental/bin on these rentals):
    # the collection's tar is then the job's, and answers with the stream above.
    script = ('cp inputs/evil.tar "$HOME/evil.tar" && printf \'#!/bin/sh\\nexec cat %s/evil.tar\\n\' "$HOME" '
              '> "$HOME/.rc-rental/bin/tar" && chmod 755 "$HOME/.rc-rental/bin/tar"')
    w.add_run(run_spec("planted", "rental-host", ["sh", "-c", script], inputs=["evil.tar"]))
    hooks_before = sorted(os.listdir(w.repo / ".git" / "hooks"))
    st = w.until("planted", lambda s: s.phase in ("Succeeded", "Failed") and s.condition("ArtifactsComplete"),
                 timeout=60)
    assert st.phase == "Succeeded" and st.handle.identity == identity, st.message
    assert st.condition("ArtifactsComplete").message.startswith("skipped ")
    assert sorted(os.listdir(w.repo / ".git" / "hooks")) == hooks_before
    b = w.bundle(identity)
    skipped = json.loads((b / "artifacts" / "manifest.json").read_text())["collection"]["skipped"]
    [why] = [e["reason"] for e in skipped if e["path"] == "artifacts/escape"]
    assert why.startswith("a symbolic link to a/b/c/") and why.endswith("/../../../../.git/hooks")
    assert _links_or_shared_inodes(b) == []
    assert (b / "artifacts" / "escape" / "reference-transaction").is_file()
    assert not Path("/tmp/rcxfer-hook-ran").exists()
    w.until("planted", lambda s: not w.rentals(), timeout=30)


# ---------------------------------------------------------------- inputs


def test_committed_links_to_git_reconciler_or_outside_are_never_staged(tmp_path):
    w = World(tmp_path / "w")
    r = w.repo
    (r / ".reconciler" / "bundles").mkdir(parents=True)
    (r / ".reconciler" / "bundles" / "state.txt").write_text("reconciler state\n")
    (r / "data").mkdir()
    (r / "data" / "real.txt").write_text("real\n")
    (r / "data" / "ok").symlink_to("real.txt")
    (r / "to-state").symlink_to(".reconciler")
    (r / "to-git").symlink_to(".git")
    (r / "to-etc").symlink_to("/etc")
    (r / "loops").mkdir()
    (r / "loops" / "up").symlink_to("..")
    (r / "nested").mkdir()
    (r / "nested" / "git").symlink_to("../.git")
    (r / "via").mkdir()
    (r / "via" / "a").symlink_to("../other")  # a link to user content, which holds a link to .git
    (r / "other").mkdir()
    (r / "other" / "b").symlink_to("../.git/HEAD")
    assert input_problem(r, "data") is None
    assert "not user content" in input_problem(r, "to-state")
    assert "not user content" in input_problem(r, "to-git")
    assert "escapes the repository" in input_problem(r, "to-etc")
    assert "the repository's root" in input_problem(r, "loops")
    assert ".git/" in input_problem(r, "nested")
    # A link inside a linked folder is judged by validation too, where staging would refuse it.
    assert input_problem(r, "via") == "input 'via' contains a symlink to .git/: via/a/b"
    # Through a real pass: the run is refused with the reason, and nothing is built for it.
    w.add_run(run_spec("links", "local-host", ["true"], inputs=["data", "to-state"]), commit=False)
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "links")
    w.run_pass()
    st = w.status("links")
    assert st.phase == "Invalid" and "to-state" in st.message and "not user content" in st.message, st.message
    assert not list((w.local_root).glob("**/inputs/to-state"))
    # At the launch the same rules hold, links inside linked folders included.
    inputs = tmp_path / "staged"
    inputs.mkdir()
    with pytest.raises(PermanentError, match=r"\.git/"):
        bundles._stage_input(r, "via", inputs)
    assert not (inputs / "via" / "a" / "b").exists()
    rec = bundles._stage_input(r, "data", inputs)
    assert rec["files"] == 2 and (inputs / "data" / "ok").read_text() == "real\n"
    assert not (inputs / "data" / "ok").is_symlink()


def test_the_staging_archive_never_reads_a_link_out_of_the_bundle(tmp_path):
    """A pinned repository's checkout may hold links; one out of the bundle is not shipped."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST SECRET\n")
    b = tmp_path / "bundle"
    code = b / "inputs" / "code"
    code.mkdir(parents=True)
    (b / "scripts").mkdir()
    (b / "job.json").write_text("{}\n")
    (code / "real.py").write_text("print(1)\n")
    (code / "alias.py").symlink_to("real.py")
    (code / "key").symlink_to(secret)
    with tarfile.open(fileobj=io.BytesIO(bundles.archive(b)), mode="r:gz") as tar:
        names = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert names == {"job.json": b"{}\n", "inputs/code/alias.py": b"print(1)\n", "inputs/code/real.py": b"print(1)\n"}


def test_damaged_streams_end_the_unpacking_never_the_pass(as_stream, tmp_path):
    """Bytes changed at random in a stream's headers: unpack returns (with an error or less), it
    never raises, and nothing lands outside the destination or as anything but a plain file."""
    import random

    base = _tar([("artifacts/a.txt", tarfile.REGTYPE, "", b"a" * 700), ("artifacts/sub", tarfile.DIRTYPE),
                 ("artifacts/sub/b.txt", tarfile.REGTYPE, "", b"b" * 100),
                 ("artifacts/link", tarfile.SYMTYPE, "../../outside/flag")])
    rng = random.Random(4517)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "flag").write_text("original\n")
    for i in range(200):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            pos = rng.choice([rng.randrange(0, 512), rng.randrange(1024, 1536), rng.randrange(0, len(data))])
            data[pos] = rng.randrange(256)
        dest = tmp_path / f"d{i}"
        dest.mkdir()
        safetar.unpack(as_stream(bytes(data)), dest)
        assert _links_or_shared_inodes(dest) == []
    assert sorted(os.listdir(outside)) == ["flag"] and (outside / "flag").read_text() == "original\n"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("d")) == ["outside"]
