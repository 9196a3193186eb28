"""The machine side of object storage: the real launch wrapper, a job writing checkpoints, and
storage_sync.py uploading them with the real rclone to a real ``rclone serve s3`` on loopback
(and to an SFTP remote served by a loopback sshd)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from reconciler.runtime import stop, storage_common, storage_fetch, storage_sync
from reconciler.tasks import env_lines
from tests.infra._proc import wait_until
from tests.infra.storage import rclone_binary
from tests.repo_helpers import processes_with

RUNTIME = Path(storage_sync.__file__).parent
BASE = "team/repo1/myrun/g1"

# Writes checkpoint-N for each N of $STEPS (trainer_state.json last), each time waiting until the
# sync program has reported it uploaded, so that retention sees every one; records its own
# environment (the job's /proc/self/environ) and what it was given to resume from.
JOB = """set -e
tr '\\0' '\\n' < /proc/$$/environ > artifacts/job-environ.txt
ls inputs/.reconciler/resume > artifacts/resume.txt 2>/dev/null || true
echo "job running"
for n in $STEPS; do
    d=artifacts/output/checkpoint-$n
    mkdir -p $d/sub
    head -c 300000 /dev/urandom > $d/model.bin
    echo '{"hidden": 8}' > $d/sub/config.json
    echo "{\\"global_step\\": $n}" > $d/trainer_state.json
    i=0
    until grep -q "\\"checkpoint-$n\\"" runtime/uploads.json 2>/dev/null; do
        i=$((i+1)); [ $i -gt 1200 ] && { echo "checkpoint-$n never uploaded" >&2; exit 9; }
        sleep 0.05
    done
done
"""


def workspace(tmp_path: Path, s3_env: str, steps: str = "1 2 3", job: str = JOB, **cfg) -> Path:
    ws = tmp_path / f"ws-{uuid.uuid4().hex[:8]}"
    (ws / "scripts").mkdir(parents=True)
    (ws / "runtime").mkdir()
    (ws / "artifacts").mkdir()
    for name in ("launch.sh", "storage_sync.py", "storage_fetch.py", "storage_common.py"):
        shutil.copy(RUNTIME / name, ws / "scripts" / name)
    (ws / "scripts" / "entrypoint.sh").write_text(f"STEPS='{steps}'\n" + job)
    doc = {"schema_version": 1, "remote": "store", "base": f"runs-bucket/{BASE}", "attempt": 1,
           "keep_checkpoints": 2, "interval_s": 1, "bwlimit": "", "rclone": rclone_binary(),
           "resume": False, "pinned": None}
    doc.update(cfg)
    (ws / "scripts" / "storage.json").write_text(json.dumps(doc))
    fd = os.open(ws / "runtime" / "storage.env", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(s3_env)
    return ws


def launch(ws: Path, timeout: float = 60) -> tuple[int, str]:
    """Run the launch wrapper as a launcher does (own session, a small base environment) and wait
    for it, final upload included."""
    ident = ws.name
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ws), "RECONCILER_GPU_SAMPLER": "0",
           "RECONCILER_HEARTBEAT_SECONDS": "1"}
    proc = subprocess.Popen(["sh", "scripts/launch.sh", ident], cwd=ws, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout), ident
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def uploads(ws: Path) -> dict:
    return json.loads((ws / "runtime" / "uploads.json").read_text())


def all_text(ws: Path) -> list[tuple[str, bytes]]:
    return [(str(p), p.read_bytes()) for p in ws.rglob("*") if p.is_file() and not p.is_symlink()
            and "scripts" not in p.parts]


def assert_no_secret(s3, blobs):
    for where, data in blobs:
        for secret in (s3.secret_key, s3.access_key):
            assert secret.encode() not in data, f"a credential leaked into {where}"


def test_checkpoints_and_artifacts_reach_the_bucket_and_credentials_reach_nothing(s3, tmp_path):
    ws = workspace(tmp_path, s3.env_lines())
    code, _ = launch(ws)
    assert code == 0, (ws / "runtime" / "runtime.log").read_text()
    assert not (ws / "runtime" / "storage.env").exists()
    ckpts = s3.objects(f"{BASE}/checkpoints/")
    # keep_checkpoints 2: checkpoint-1 went, manifest and folder; 2 and 3 are complete.
    assert sorted({k.split("/")[5] for k in ckpts}) == ["checkpoint-2", "checkpoint-2.json", "checkpoint-3",
                                                        "checkpoint-3.json"]
    state = uploads(ws)
    assert [c["name"] for c in state["checkpoints"]] == ["checkpoint-2", "checkpoint-3"]
    assert state["error"] is None and state["artifacts"]["final"] is True
    assert state["artifacts"]["uri"] == f"store:runs-bucket/{BASE}/a1"
    for entry in state["checkpoints"]:
        raw = s3.path(f"{BASE}/checkpoints/{entry['name']}.json").read_bytes()
        assert hashlib.sha256(raw).hexdigest() == entry["manifest_sha256"]
        man = json.loads(raw)
        assert {f["path"] for f in man["files"]} == {"model.bin", "sub/config.json", "trainer_state.json"}
        for f in man["files"]:
            data = s3.path(f"{BASE}/checkpoints/{entry['name']}/{f['path']}").read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (f["size"], f["sha256"])
        assert entry["files"] == 3 and entry["bytes"] == sum(f["size"] for f in man["files"])
    arts = s3.objects(f"{BASE}/a1/")
    assert f"{BASE}/a1/stdout.log" in arts and f"{BASE}/a1/runtime/result.json" in arts
    assert not [k for k in arts if "checkpoint-" in k]
    assert "job running" in s3.path(f"{BASE}/a1/stdout.log").read_text()
    environ = (ws / "artifacts" / "job-environ.txt").read_text()
    assert "RECONCILER_IDENTITY=" in environ and "RCLONE_CONFIG" not in environ
    assert_no_secret(s3, all_text(ws) + [(k, s3.path(k).read_bytes()) for k in s3.objects()])


def test_a_failing_remote_is_recorded_and_retried_without_touching_the_job(s3, tmp_path):
    """The server is down while the job writes its checkpoint: the job goes on, the error is
    recorded (one line, no secret), and the next round after the server is back uploads it."""
    s3.stop()
    ws = workspace(tmp_path, s3.env_lines(), steps="1")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ws), "RECONCILER_GPU_SAMPLER": "0"}
    proc = subprocess.Popen(["sh", "scripts/launch.sh", ws.name], cwd=ws, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (ws / "runtime" / "uploads.json").exists() and uploads(ws)["error"], 60,
                   what="the error recorded")
        err = uploads(ws)["error"]
        assert "rclone" in err and "\n" not in err and len(err) <= 300
        assert s3.secret_key not in err
        s3.start()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    state = uploads(ws)
    assert [c["name"] for c in state["checkpoints"]] == ["checkpoint-1"] and state["error"] is None
    assert s3.path(f"{BASE}/checkpoints/checkpoint-1.json").is_file()


def test_the_final_upload_is_bounded(s3, tmp_path):
    """A remote that does not answer cannot keep the wrapper (and the machine) waiting: past
    RECONCILER_STORAGE_FINAL_SECONDS the last round gives up and says so."""
    s3.stop()
    ws = workspace(tmp_path, s3.env_lines())
    (ws / "runtime" / "result.json").write_text('{"state": "succeeded", "exit_code": 0}')
    proc = subprocess.run([sys.executable, "scripts/storage_sync.py", "watch", "."], cwd=ws,
                          input=s3.env_lines().encode(), capture_output=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "RECONCILER_STORAGE_FINAL_SECONDS": "2"})
    assert proc.returncode == 1
    state = uploads(ws)
    assert state["artifacts"]["final"] is False and state["artifacts"]["uploaded_at"] is None
    assert "timed out after" in state["error"] or "out of time" in state["error"]


def _seed(s3, tmp_path, steps="2 4"):
    """A first attempt that left complete checkpoints in the bucket; returns its uploads.json."""
    ws = workspace(tmp_path, s3.env_lines(), steps=steps, keep_checkpoints=3)
    assert launch(ws)[0] == 0
    return {c["name"]: c for c in uploads(ws)["checkpoints"]}


def test_fetch_resumes_from_the_newest_complete_checkpoint_that_verifies(s3, tmp_path):
    seeded = _seed(s3, tmp_path)
    root = s3.path(f"{BASE}/checkpoints")
    # checkpoint-4 was tampered with after upload; checkpoint-5 is an upload cut short (no manifest).
    with open(root / "checkpoint-4" / "model.bin", "r+b") as fh:
        fh.write(b"X")
    shutil.copytree(root / "checkpoint-2", root / "checkpoint-5")
    want = (root / "checkpoint-2" / "model.bin").read_bytes()  # (attempt 2 prunes it later)
    ws = workspace(tmp_path, s3.env_lines(), steps="6", resume=True, attempt=2)
    assert launch(ws)[0] == 0
    resume = ws / "inputs" / ".reconciler" / "resume"
    assert (ws / "artifacts" / "resume.txt").read_text().split() == ["checkpoint-2", "latest"]
    assert os.readlink(resume / "latest") == "checkpoint-2"
    got = resume / "checkpoint-2" / "model.bin"
    assert got.read_bytes() == want
    rf = uploads(ws)["resumed_from"]
    assert rf == {"name": "checkpoint-2", "uri": f"store:runs-bucket/{BASE}/checkpoints/checkpoint-2",
                  "manifest_sha256": seeded["checkpoint-2"]["manifest_sha256"]}
    assert "skipped checkpoint-4" in (ws / "runtime" / "runtime.log").read_text()


def test_fetch_starts_fresh_from_an_empty_bucket(s3, tmp_path):
    ws = workspace(tmp_path, s3.env_lines(), steps="1", resume=True)
    assert launch(ws)[0] == 0
    assert (ws / "artifacts" / "resume.txt").read_text() == ""
    assert uploads(ws)["resumed_from"] is None


def test_a_pinned_checkpoint_is_verified_and_a_tampered_one_refused(s3, tmp_path):
    seeded = _seed(s3, tmp_path)
    pin = {"checkpoint": "checkpoint-4", "uri": f"store:runs-bucket/{BASE}/checkpoints/checkpoint-4",
           "manifest_sha256": seeded["checkpoint-4"]["manifest_sha256"]}
    ws = workspace(tmp_path, s3.env_lines(), steps="5", resume=True, attempt=2, pinned=pin,
                   keep_checkpoints=5)
    assert launch(ws)[0] == 0
    assert (ws / "artifacts" / "resume.txt").read_text().split() == ["checkpoint-4", "latest"]

    with open(s3.path(f"{BASE}/checkpoints/checkpoint-4/sub/config.json"), "ab") as fh:
        fh.write(b" ")
    ws = workspace(tmp_path, s3.env_lines(), steps="5", resume=True, attempt=3, pinned=pin)
    code, _ = launch(ws)
    assert code == 3
    assert not (ws / "artifacts" / "job-environ.txt").exists()  # the job never started
    result = json.loads((ws / "runtime" / "result.json").read_text())
    assert result["state"] == "failed" and "pinned checkpoint checkpoint-4" in result["message"]
    assert not list((ws / "inputs" / ".reconciler" / "resume").iterdir())  # nothing half-written

    # A manifest that is not the pinned one (replaced in the bucket) is refused before any download.
    ws = workspace(tmp_path, s3.env_lines(), steps="5", resume=True, attempt=4,
                   pinned=dict(pin, manifest_sha256="0" * 64))
    assert launch(ws)[0] == 3
    assert "not the pinned one" in json.loads((ws / "runtime" / "result.json").read_text())["message"]
    # A pin whose URI is not that checkpoint's folder (another name, a path out of the store) is refused.
    for bad in (dict(pin, checkpoint="checkpoint-2"), dict(pin, uri="store:../elsewhere/checkpoint-4"),
                dict(pin, uri="other:runs-bucket/checkpoint-4")):
        ws = workspace(tmp_path, s3.env_lines(), steps="5", resume=True, attempt=5, pinned=bad)
        assert launch(ws)[0] == 3
        assert "not a checkpoint folder" in json.loads((ws / "runtime" / "result.json").read_text())["message"]


def test_terminate_ends_the_sync_program_with_the_job(s3, tmp_path):
    ws = workspace(tmp_path, s3.env_lines(), steps="1", job="sleep 600\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ws), "RECONCILER_GPU_SAMPLER": "0"}
    subprocess.Popen(["sh", "scripts/launch.sh", ws.name], cwd=ws, env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (ws / "runtime" / "uploads.json").exists() and uploads(ws)["artifacts"]["uploaded_at"],
               30, what="a first round")
    assert [p for p in processes_with(ws.name, within=ws)
            if b"storage_sync.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
    out = stop.terminate(str(ws), ws.name, grace=5)
    assert out["was_alive"] and not out.get("error")
    wait_until(lambda: not processes_with(ws.name, within=ws), 10, what="every process of the run gone")
    assert json.loads((ws / "runtime" / "result.json").read_text())["state"] == "terminated"


def test_an_sftp_remote_works_the_same(sshd, tmp_path):
    home = Path(sshd.home)
    store = home / f"rc-store-{uuid.uuid4().hex[:6]}"
    env = {"TYPE": "sftp", "HOST": sshd.host, "PORT": str(sshd.port), "USER": sshd.user,
           "KEY_FILE": str(sshd.identity_file), "KNOWN_HOSTS_FILE": str(sshd.known_hosts_file)}
    lines = "".join(f"export RCLONE_CONFIG_STORE_{k}='{v}'\n" for k, v in env.items())
    try:
        ws = workspace(tmp_path, lines, steps="1 2", base=f"{store.name}/{BASE}")
        assert launch(ws)[0] == 0, (ws / "runtime" / "runtime.log").read_text()
        assert (store / BASE / "checkpoints" / "checkpoint-2.json").is_file()
        assert (store / BASE / "checkpoints" / "checkpoint-2" / "model.bin").is_file()
        ws2 = workspace(tmp_path, lines, steps="3", base=f"{store.name}/{BASE}", resume=True, attempt=2)
        assert launch(ws2)[0] == 0
        assert uploads(ws2)["resumed_from"]["name"] == "checkpoint-2"
    finally:
        shutil.rmtree(store, ignore_errors=True)


# ------------------------------------------------------------------ what comes from the bucket

def _manifest(**over):
    doc = {"schema_version": 1, "checkpoint": "checkpoint-7", "step": 7,
           "files": [{"path": "a/b.bin", "size": 3, "sha256": "0" * 64}]}
    doc.update(over)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("doc, why", [
    (_manifest(files=[{"path": "../x", "size": 1, "sha256": "0" * 64}]), "bad"),
    (_manifest(files=[{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}]), "bad"),
    (_manifest(files=[{"path": "a//b", "size": 1, "sha256": "0" * 64}]), "bad"),
    (_manifest(files=[{"path": "a", "size": 1, "sha256": "0" * 64}, {"path": "a/b", "size": 1, "sha256": "0" * 64}]),
     "as a file and a folder"),
    (_manifest(files=[{"path": "x", "size": -1, "sha256": "0" * 64}]), "bad"),
    (_manifest(files=[{"path": "x", "size": 1, "sha256": "zz"}]), "bad"),
    (_manifest(files=[{"path": "x", "size": 1, "sha256": "0" * 64}] * 2), "repeated"),
    (_manifest(checkpoint="checkpoint-8"), "does not describe"),
    (_manifest(step=8), "does not describe"),
    (_manifest(files=[{"path": str(i), "size": 1, "sha256": "0" * 64} for i in range(100_001)]), "does not describe"),
    (b"[" * 100_000, "not JSON"),
])
def test_a_manifest_from_the_bucket_is_validated(doc, why):
    with pytest.raises(storage_common.Failure, match=why):
        storage_fetch.parse_manifest(doc, "checkpoint-7")


def test_only_the_remote_variables_are_taken_from_storage_env():
    pem = "-----BEGIN KEY-----\nabc\n-----END KEY-----\n"
    lines = env_lines({"RCLONE_CONFIG_STORE_TYPE": "s3", "LD_PRELOAD": "/x.so", "RCLONE_CONFIG_OTHER_TYPE": "s3",
                       "RCLONE_CONFIG_STORE_KEY": "a b'c", "RCLONE_CONFIG_STORE_KEY_PEM": pem})
    env = storage_common.parse_env(lines.encode())
    assert env == {"RCLONE_CONFIG_STORE_TYPE": "s3", "RCLONE_CONFIG_STORE_KEY": "a b'c",
                   "RCLONE_CONFIG_STORE_KEY_PEM": pem}
    assert storage_common.parse_env(b"export RCLONE_CONFIG_STORE_TYPE='s3") == {}


def test_checkpoint_names_from_the_bucket_are_validated(s3, tmp_path):
    root = s3.path(f"{BASE}/checkpoints")
    root.mkdir(parents=True)
    for name in ("checkpoint-1.json", "checkpoint-x.json", "checkpoint-99999999999999.json", "..json", "notes.json"):
        (root / name).write_text("{}")
    cfg = {"base": f"runs-bucket/{BASE}", "rclone": rclone_binary(), "bwlimit": ""}
    rc = storage_common.Rclone(str(tmp_path), cfg, storage_common.parse_env(s3.env_lines().encode()))
    assert rc.manifests() == {1: "checkpoint-1"}
