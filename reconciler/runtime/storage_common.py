"""What both halves of storage_sync.py share: the run's storage description, rclone, the files.

storage_sync.py (``watch``: uploads beside the job) and storage_fetch.py (``fetch``: resumes before
it) read the same ``scripts/storage.json``, run the same rclone with the remote's environment
and nothing of the job's, and hash and list files the same way; every byte from the bucket or
from the job's files is bounded here. Standard library only: it runs with the machine's python3.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import time

REMOTE = "store"
MAX_ENV = 64 << 10  # storage.env: a handful of options and credentials
MAX_LISTING = 8 << 20  # a listing of one folder of the bucket
MAX_MANIFEST = 16 << 20
MAX_FILES = 100_000  # files in one checkpoint (a sharded 70B model has a few hundred)
MAX_PATH = 1024
MAX_SIZE = 1 << 50  # one file: far beyond any real shard
MAX_ERROR = 300
CKPT = re.compile(r"checkpoint-([0-9]{1,12})\Z")
ENV_NAME = re.compile(r"RCLONE_CONFIG_STORE_[A-Z0-9_]{1,64}\Z")
SHA = re.compile(r"[0-9a-f]{64}\Z")
# rclone options whose values are credentials (s3 access_key_id/secret_access_key/session_token,
# sftp pass/key_pem/key_file_pass, gcs service_account_credentials, azureblob key/sas_url, b2
# account/key, swift key/auth_token): their values are redacted from every message.
SECRET_OPTION = re.compile(r"(KEY|SECRET|TOKEN|PASS|CREDENTIAL|PEM|SAS|ACCOUNT|AUTH)")
BASE = re.compile(r"[A-Za-z0-9._\-/=+@]{1,512}\Z")
BWLIMIT = re.compile(r"[0-9A-Za-z.:,\- ]{0,64}\Z")
RESUME_DIR = os.path.join("inputs", ".reconciler", "resume")
# Everything the program starts (rclone) gets this environment plus the remote's, never the job's.
ENV_KEEP = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ")


class Failure(Exception):
    """What went wrong, in one line without secrets: recorded, and retried on the next round."""


def _now():
    return int(time.time())


def _one_line(text, secrets=()):
    for s in secrets:
        text = text.replace(s, "[redacted]")
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR else "…" + text[-(MAX_ERROR - 1):]  # the end says why


def _is_int(v, lo=0, hi=2**62):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def load_config(ws):
    """scripts/storage.json, checked: a malformed file is refused whole (the control plane wrote it)."""
    with open(os.path.join(ws, "scripts", "storage.json"), "rb") as fh:
        cfg = json.loads(fh.read(1 << 20).decode("utf-8"))
    ok = (isinstance(cfg, dict) and cfg.get("schema_version") == 1 and cfg.get("remote") == REMOTE
          and isinstance(cfg.get("base"), str) and BASE.match(cfg["base"]) and ".." not in cfg["base"].split("/")
          and not cfg["base"].startswith("/") and _is_int(cfg.get("attempt"), 1)
          and _is_int(cfg.get("keep_checkpoints"), 1, 10_000) and _is_int(cfg.get("interval_s", 30), 1, 86_400)
          and isinstance(cfg.get("bwlimit", ""), str) and BWLIMIT.match(cfg.get("bwlimit", ""))
          and isinstance(cfg.get("rclone"), str) and cfg["rclone"] and isinstance(cfg.get("resume"), bool))
    if not ok:
        raise Failure("scripts/storage.json is not a valid storage description")
    pin = cfg.get("pinned")
    if pin is not None and not (isinstance(pin, dict) and isinstance(pin.get("checkpoint"), str)
                                and CKPT.match(pin["checkpoint"]) and isinstance(pin.get("manifest_sha256"), str)
                                and SHA.match(pin["manifest_sha256"])):
        raise Failure("scripts/storage.json: pinned must name checkpoint-N and its manifest_sha256")
    cfg.setdefault("interval_s", 30)
    cfg["base"] = cfg["base"].strip("/")
    return cfg


def parse_env(data):
    """``export NAME='value'`` lines (runtime/secrets.env's quoting, where a value such as a key in
    PEM may span lines): only RCLONE_CONFIG_STORE_* names are taken, so the file cannot set
    anything else for rclone (LD_PRELOAD, PATH). A file shlex cannot read gives nothing."""
    try:
        words = shlex.split(data[:MAX_ENV].decode("utf-8", "replace"))
    except ValueError:
        return {}
    env = {}
    for word in words:
        name, eq, value = word.partition("=")
        if eq and ENV_NAME.match(name):
            env[name] = value
    return env


class Rclone:
    """rclone with the remote's environment and nothing of the job's; every reply bounded."""

    def __init__(self, ws, cfg, store_env):
        path = cfg["rclone"]
        self.bin = path if os.path.isabs(path) else os.path.join(ws, path)
        self.base = cfg["base"]
        self.bw = ["--bwlimit", cfg["bwlimit"]] if cfg.get("bwlimit") else []
        self.env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        self.env.update(store_env)
        # What an error line must never show: the credentials, not the endpoint or the region
        # (a message reading "store:[redacted]-outputs" helps nobody).
        self.secrets = [v for k, v in store_env.items() if len(v) >= 4 and SECRET_OPTION.search(k)]
        self.deadline = None  # the final round's: every call after it is cut short

    def uri(self, rel=""):
        return f"{REMOTE}:{self.base}/{rel}" if rel else f"{REMOTE}:{self.base}"

    def run(self, args, limit=1 << 16, stdin=b"", timeout=None):
        """Run rclone; its stdout (at most ``limit`` bytes) or Failure with its last error line."""
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Failure("out of time for the final upload")
            timeout = left if timeout is None else min(timeout, left)
        # --retries 1: the next round is the retry (a copy skips what is already there); a few
        # low-level retries ride out a dropped connection without waiting minutes on a dead remote.
        argv = [self.bin, "--config", os.devnull, "-q", "--retries", "1", "--low-level-retries", "3"] + args
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
            inp.write(stdin)
            inp.seek(0)
            try:
                proc = subprocess.Popen(argv, stdin=inp, stdout=out, stderr=err, env=self.env)
            except OSError as e:
                raise Failure(f"cannot run rclone ({self.bin}): {e.strerror}") from None
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise Failure(f"rclone {args[0]} timed out after {int(timeout)}s") from None
            if rc != 0:
                err.seek(max(0, err.seek(0, 2) - 4096))
                text = err.read().decode("utf-8", "replace").strip().splitlines() or [""]
                raise Failure(_one_line(f"rclone {args[0]} failed (exit {rc}): {text[-1]}", self.secrets))
            if out.seek(0, 2) > limit:
                raise Failure(f"rclone {args[0]}: reply over {limit} bytes")
            out.seek(0)
            return out.read()

    def listing(self, rel):
        """Names of the files and of the folders right under ``rel``: ([files], [folders])."""
        data = self.run(["lsjson", "--no-mimetype", "--no-modtime", self.uri(rel)], MAX_LISTING, timeout=300)
        try:
            items = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            raise Failure(f"the listing of {rel} is not JSON") from None
        if not isinstance(items, list):
            raise Failure(f"the listing of {rel} is not a list")
        named = [i for i in items if isinstance(i, dict) and isinstance(i.get("Name"), str)]
        return [i["Name"] for i in named if i.get("IsDir") is not True], [i["Name"] for i in named if i.get("IsDir") is True]

    def catalog(self):
        """({step: name} of the checkpoints whose manifest object is there (complete ones),
        [checkpoint folders]), from one listing."""
        files, folders = self.listing("checkpoints")
        found = {}
        for name in files:
            m = CKPT.match(name[:-5]) if name.endswith(".json") else None
            if m:
                found[int(m.group(1))] = name[:-5]
        return found, [f for f in folders if CKPT.match(f)]

    def manifests(self):
        return self.catalog()[0]

# ------------------------------------------------------------------ files on the machine

def _walk_files(root):
    """Plain files under ``root`` as sorted relative posix paths; links and specials are skipped
    (rclone skips them too), counts and lengths bounded."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                if not stat.S_ISREG(os.lstat(full).st_mode):
                    continue
            except OSError:
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if len(rel) > MAX_PATH or "\n" in rel:
                raise Failure(f"{os.path.basename(root)}: a file path is too long or has a newline")
            found.append(rel)
            if len(found) > MAX_FILES:
                raise Failure(f"{os.path.basename(root)}: over {MAX_FILES} files")
    return sorted(found)


def _sha256(path, want_size=None):
    h, n = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            k = fh.readinto(buf)
            if not k:
                break
            h.update(view[:k])
            n += k
            if want_size is not None and n > want_size:
                break
    return h.hexdigest(), n

# ------------------------------------------------------------------ uploads.json

def write_uploads(ws, state):
    rt = os.path.join(ws, "runtime")
    os.makedirs(rt, exist_ok=True)
    tmp = os.path.join(rt, ".uploads.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh, sort_keys=True)
    os.replace(tmp, os.path.join(rt, "uploads.json"))


def new_state(rc, cfg, resumed_from=None):
    return {"schema_version": 1, "checkpoints": [], "resumed_from": resumed_from, "error": None,
            "artifacts": {"uri": rc.uri(f"a{cfg['attempt']}"), "uploaded_at": None, "final": False}}

def refuse(ws, code, message):
    rt = os.path.join(ws, "runtime")
    os.makedirs(rt, exist_ok=True)
    tmp = os.path.join(rt, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": "failed", "exit_code": code, "finished_ts": time.time(), "message": message}, fh)
    os.replace(tmp, os.path.join(rt, "result.json"))
    print(f"storage_sync: {message}", file=sys.stderr)
    return code
