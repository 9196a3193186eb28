"""The daemon end to end: real git remotes (a bare repository on disk), real daemon subprocesses,
real launched processes. Each test waits on conditions with timeouts, never on fixed sleeps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .conftest import git, http, process_groups_with, run_spec, sign, wait_for

SECRET = "s3cret-for-tests"


def test_pushed_spec_is_launched_and_its_status_reaches_the_remote(world):
    d = world.start(world.clone("daemon"))
    d.wait_ready()
    world.add_spec("hello")
    st = wait_for(lambda: world.remote_status("hello"), timeout=20, what="status/hello.yaml on the remote")
    assert st["phase"] == "Running"
    assert st["handle"]["identity"] == "hello-g1-a1"
    pid = world.pid_of("hello-g1-a1")
    assert pid and process_groups_with("hello-g1-a1", world.ws) == {pid}
    assert world.merges() == []
    head = world.remote_log()[0]
    assert head.split(" ", 1)[1].startswith("status: 1 transition(s)")


def test_push_race_both_commits_land_history_linear(world):
    hold = world.tmp / "hold-push"
    hold.write_text("")
    d = world.start(world.clone("daemon"), hold_push=hold)
    d.wait_ready()
    world.add_spec("racer")
    # The daemon launched, committed status locally and now waits before pushing.
    wait_for(lambda: Path(str(hold) + ".held").exists(), timeout=20, what="the daemon to hold its push")
    assert world.remote_status("racer") is None
    # Meanwhile the user pushes another change.
    world.add_spec("second")
    user_head = git(world.origin, "rev-parse", "main")
    hold.unlink()
    wait_for(lambda: world.remote_status("racer") and world.remote_status("second"), timeout=20,
             what="both runs' status on the remote")
    log = git(world.origin, "rev-list", "main").split()
    assert user_head in log, "the user's commit was lost"
    assert world.merges() == [], "a merge commit reached the remote"
    assert world.remote_status("racer")["handle"]["identity"] == "racer-g1-a1"
    wait_for(lambda: d.logged("push rejected: the remote moved; rebasing and retrying"), timeout=5,
             what="the retry to be logged")
    status, body = http("GET", d.url + "/metrics")
    retries = re.search(r"^reconciler_push_retries_total (\S+)$", body.decode(), re.M)
    assert retries and float(retries.group(1)) >= 1


def test_kill_after_apply_then_fresh_clone_adopts_without_relaunch(world):
    # The crash comes after the first apply, so the spec is there before the daemon's first pass.
    world.add_spec("sturdy")
    d = world.start(world.clone("vm1"), listen=False, crash_after="apply")
    wait_for(lambda: d.proc.poll() is not None, timeout=20, what="the daemon to crash after apply")
    assert d.proc.returncode == 137, d.text()
    assert d.logged("daemon started") and not d.logged("pass")
    pid = world.pid_of("sturdy-g1-a1")
    assert pid, "the run was launched before the crash"
    assert world.remote_status("sturdy") is None, "no status reached the remote before the crash"

    # Another VM: a fresh clone elsewhere, same remote, same workspace root.
    d2 = world.start(world.clone("vm2"), listen=False)
    d2.wait_ready()
    st = wait_for(lambda: world.remote_status("sturdy"), timeout=20, what="the adopted status on the remote")
    assert st["phase"] == "Running" and st["attempt"] == 1 and st["generation"] == 1
    assert st["handle"]["identity"] == "sturdy-g1-a1"
    assert any("adopt" in h["reason"] for h in st["history"]), st["history"]
    assert world.workspaces() == ["sturdy-g1-a1"], "launched twice"
    assert process_groups_with("sturdy-g1-a1", world.ws) == {pid}
    assert not process_groups_with("sturdy-g1-a2", world.ws)


def test_crash_after_commit_before_push_is_derived_again(world):
    d = world.start(world.clone("vm1"), listen=False, crash_after="commit")
    d.wait_ready()
    world.add_spec("late")
    wait_for(lambda: d.proc.poll() is not None, timeout=20, what="the daemon to crash after its commit")
    assert d.proc.returncode == 137 and world.remote_status("late") is None
    d2 = world.start(world.clone("vm2"), listen=False)
    d2.wait_ready()
    st = wait_for(lambda: world.remote_status("late"), timeout=20, what="status derived again")
    assert st["phase"] == "Running" and st["attempt"] == 1
    assert world.workspaces() == ["late-g1-a1"]


def test_second_daemon_refused_and_sigterm_pushes_and_exits_0(world):
    clone = world.clone("daemon")
    hold = world.tmp / "hold-push"
    hold.write_text("")
    d = world.start(clone, hold_push=hold)
    d.wait_ready()

    other = world.start(clone, listen=False)
    wait_for(lambda: other.proc.poll() is not None, timeout=20, what="the second daemon to give up")
    assert other.proc.returncode == 2
    assert f"pid {d.proc.pid}" in other.text() and "already running" in other.text(), other.text()
    assert d.proc.poll() is None
    # A one-off pass on the same checkout is refused too; a dry run (it writes nothing) is not.
    once = subprocess.run([sys.executable, "-m", "reconciler", "--once", "--repo", str(clone)], capture_output=True,
                          text=True, env=world.env(), timeout=60)
    assert once.returncode == 2 and f"pid {d.proc.pid}" in once.stderr, once.stderr
    plan = subprocess.run([sys.executable, "-m", "reconciler", "plan", "--repo", str(clone)], capture_output=True,
                          text=True, env=world.env(), timeout=60)
    assert plan.returncode == 0, plan.stderr

    world.add_spec("graceful")
    wait_for(lambda: Path(str(hold) + ".held").exists(), timeout=20, what="a status commit waiting to be pushed")
    d.proc.send_signal(signal.SIGTERM)
    hold.unlink()
    assert d.proc.wait(timeout=20) == 0, d.text()
    st = world.remote_status("graceful")
    assert st is not None and st["phase"] == "Running"
    assert d.logged("daemon stopped")
    # The lock went with the process: a new daemon starts on the same checkout.
    again = world.start(clone, listen=False)
    again.wait_ready()


def test_webhook_bad_signature_refused_good_one_fetches_at_once(world):
    clone = world.clone("daemon")
    d = world.start(clone, RECONCILER_POLL_INTERVAL="300", RECONCILER_RESYNC_INTERVAL="300",
                    RECONCILER_WEBHOOK_SECRET=SECRET)
    d.wait_ready()
    world.add_spec("hooked")
    tracking_before = git(clone, "rev-parse", "refs/remotes/origin/main")
    body = json.dumps({"ref": "refs/heads/main", "after": git(world.origin, "rev-parse", "main")}).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push"}

    code, _ = http("POST", d.url + "/hooks/git", body, headers)
    assert code == 401
    code, _ = http("POST", d.url + "/hooks/git", body, dict(headers, **{"X-Hub-Signature-256": sign("wrong", body)}))
    assert code == 401
    code, _ = http("POST", d.url + "/hooks/git", body + b" ", dict(headers, **{"X-Hub-Signature-256": sign(SECRET, body)}))
    assert code == 401
    assert git(clone, "rev-parse", "refs/remotes/origin/main") == tracking_before, "a refused webhook fetched"
    assert not world.workspaces()
    # Correctly signed, but for another branch: accepted and ignored, nothing fetched.
    other = json.dumps({"ref": "refs/heads/feature"}).encode()
    code, _ = http("POST", d.url + "/hooks/git", other, dict(headers, **{"X-Hub-Signature-256": sign(SECRET, other),
                                                                         "X-GitHub-Delivery": "delivery-other"}))
    assert code == 202
    wait_for(lambda: d.logged("webhook: push to another branch; nothing to fetch"), timeout=10, what="the ignore")
    assert git(clone, "rev-parse", "refs/remotes/origin/main") == tracking_before

    # Signed, but without the delivery id GitHub always sends: refused, nothing fetched.
    code, _ = http("POST", d.url + "/hooks/git", body, dict(headers, **{"X-Hub-Signature-256": sign(SECRET, body)}))
    assert code == 400
    assert git(clone, "rev-parse", "refs/remotes/origin/main") == tracking_before

    t0 = time.monotonic()
    code, _ = http("POST", d.url + "/hooks/git", body, dict(headers, **{"X-Hub-Signature-256": sign(SECRET, body),
                                                                        "X-GitHub-Delivery": "delivery-main"}))
    assert code == 202
    wait_for(lambda: world.pid_of("hooked-g1-a1"), timeout=10, what="the webhook to launch the run")
    assert time.monotonic() - t0 < 10  # the poll interval is 300 s
    wait_for(lambda: world.remote_status("hooked"), timeout=10, what="its status on the remote")
    _, metrics = http("GET", d.url + "/metrics")
    text = metrics.decode()
    webhooks = {labels["result"]: v for _, labels, v in parse_exposition(text)["reconciler_webhooks_total"]["samples"]}
    assert webhooks == {"refused": 4, "accepted": 1, "ignored": 1}  # three bad signatures, one without a delivery id


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
                    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? (\S+)$')


def parse_exposition(text: str) -> dict[str, dict]:
    """A strict reader of the Prometheus text format: every line a comment or a valid sample."""
    families: dict[str, dict] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            fam = families.setdefault(parts[2], {"samples": []})
            fam["help" if parts[1] == "HELP" else "type"] = parts[3]
            continue
        assert not line.startswith("#") and line.strip(), f"bad line {line!r}"
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(3) or "", m.group(4)
        float(value.replace("+Inf", "inf"))
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        fam = families.get(name) or families.get(base)
        assert fam is not None and "type" in fam, f"sample {name} before its TYPE line"
        fam["samples"].append((name, dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels)),
                               float(value.replace("+Inf", "inf"))))
    return families


def test_metrics_parse_and_healthz_answers(world):
    d = world.start(world.clone("daemon"))
    d.wait_ready()
    world.add_spec("measured")
    wait_for(lambda: world.remote_status("measured"), timeout=20, what="a launch")

    code, body = http("GET", d.url + "/healthz")
    assert code == 200
    health = json.loads(body)
    assert health["ok"] is True and health["last_good_pass_at"]

    def running_gauge():
        fams = parse_exposition(http("GET", d.url + "/metrics")[1].decode())
        return fams if ("phase", "Running") in {(k, v) for _, l, val in fams["reconciler_runs"]["samples"]
                                               for k, v in l.items() if val == 1} else None

    fams = wait_for(running_gauge, timeout=10, what="reconciler_runs{phase=Running} 1")
    assert fams["reconciler_passes_total"]["type"] == "counter"
    assert any(l == {"result": "ok"} and v >= 1 for _, l, v in fams["reconciler_passes_total"]["samples"])
    hist = fams["reconciler_pass_duration_seconds"]
    assert hist["type"] == "histogram"
    buckets = [(l["le"], v) for n, l, v in hist["samples"] if n.endswith("_bucket")]
    assert buckets[-1][0] == "+Inf"
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "histogram buckets must be cumulative"
    count = next(v for n, _, v in hist["samples"] if n.endswith("_count"))
    assert counts[-1] == count
    assert ({"action": "launch"}, 1.0) in [(l, v) for _, l, v in fams["reconciler_actions_total"]["samples"]]
    assert fams["reconciler_push_retries_total"]["type"] == "counter"
    last_good = fams["reconciler_last_good_pass_timestamp_seconds"]["samples"][0][2]
    assert abs(last_good - time.time()) < 60
    assert http("GET", d.url + "/nope")[0] == 404


def test_healthz_503_while_passes_fail_then_200(world):
    world.add_spec("blocked")
    clone = world.clone("daemon")
    # status/ as a file makes writing status fail: every pass fails, the daemon stays up, unhealthy.
    (clone / "status").write_text("not a directory\n")
    d = world.start(clone, RECONCILER_RESYNC_INTERVAL="0.5")
    d.wait_ready()
    wait_for(lambda: d.logged("pass failed"), timeout=15, what="a failed pass")
    code, body = http("GET", d.url + "/healthz")
    assert code == 503
    health = json.loads(body)
    assert health["ok"] is False and health["last_error"] and health["last_good_pass_at"] is None
    assert d.proc.poll() is None
    (clone / "status").unlink()
    wait_for(lambda: http("GET", d.url + "/healthz")[0] == 200, timeout=15, what="a healthy /healthz")
    wait_for(lambda: world.remote_status("blocked"), timeout=15, what="status once passes succeed")
    assert world.workspaces() == ["blocked-g1-a1"]


def test_sighup_rereads_the_configuration_file(world, tmp_path):
    conf = tmp_path / "reconciler-conf.yaml"
    conf.write_text("unreachable_grace: 100\n")
    d = world.start(world.clone("daemon"), listen=False, args=("--config", str(conf)))
    d.wait_ready()
    conf.write_text("unreachable_grace: 7\nauthor_name: renamed\n")
    d.proc.send_signal(signal.SIGHUP)
    ev = wait_for(lambda: d.logged("configuration reloaded"), timeout=10, what="the reload")[0]
    assert ev["config"]["unreachable_grace"] == 7 and ev["config"]["author_name"] == "renamed"
    assert ev["config"]["resync_interval"] == 2  # the environment still wins over the file
    assert d.proc.poll() is None


def test_config_redacts_the_webhook_secret(world):
    env = world.env(RECONCILER_WEBHOOK_SECRET=SECRET)
    p = subprocess.run([os.sys.executable, "-m", "reconciler", "config", "--repo", str(world.user)],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    assert SECRET not in p.stdout
    assert json.loads(p.stdout)["webhook_secret"] == "***"


def _idle_daemon(world, clone, **env):
    """A daemon woken only by local changes (no listener, no poll or resync within a test), after
    its first pass."""
    d = world.start(clone, listen=False, RECONCILER_POLL_INTERVAL="300", RECONCILER_RESYNC_INTERVAL="300", **env)
    d.wait_ready()
    wait_for(lambda: d.logged("pass"), timeout=20, what="the first pass")
    return d


def _local_passes(d) -> list[dict]:
    return [e for e in d.logged("pass") if "local change" in (e.get("why") or "")]


def test_a_burst_of_fifty_spec_files_is_one_pass_and_each_run_starts_once(world):
    clone = world.clone("daemon")
    # A quiet time of 1 s: the writer below is this test's process, and on a loaded machine it can
    # stall for longer than the 0.2 s the other tests use, which is a writer that stopped.
    d = _idle_daemon(world, clone, RECONCILER_DEBOUNCE="1", RECONCILER_LOG_LEVEL="DEBUG")
    runs = clone / "specs" / "runs"
    names = [f"burst-{i:02d}" for i in range(50)]
    for i, name in enumerate(names):  # back to back, each atomically (as an editor or git writes a file)
        if i == 25:
            time.sleep(0.05)  # the input, not a wait: a writer descheduled halfway, longer than a watch step
        tmp = runs / f".{name}.yaml.tmp"
        tmp.write_text(run_spec(name, "sleep 60"))
        os.replace(tmp, runs / f"{name}.yaml")
    wait_for(lambda: all(world.pid_of(f"{n}-g1-a1") for n in names), timeout=120, what="the 50 runs to start")
    # One more file after them, written the same way: its pass comes after any pass the burst could
    # still ask for. (A plain write could be seen twice on a loaded machine: its creation and its
    # content a watch step apart, each a change of its own.)
    (runs / ".marker.yaml.tmp").write_text(run_spec("marker", "sleep 60"))
    os.replace(runs / ".marker.yaml.tmp", runs / "marker.yaml")
    wait_for(lambda: len(_local_passes(d)) >= 1 and _local_passes(d)[-1].get("plan") == {"launch": 1},
             timeout=30, what="the marker's pass")
    assert [p["plan"] for p in _local_passes(d)] == [{"launch": 50}, {"launch": 1}], d.text()[-3000:]
    # (How many batches the watcher handed over is not asserted: a writer stalled for longer than
    # the quiet time cuts the burst in two, and a pass that starts after the stall still sees
    # every file. The passes above are the promise.)
    assert world.workspaces() == sorted(f"{n}-g1-a1" for n in [*names, "marker"])  # each launched once
    # The burst's launches overlap, from the daemon's own record (engine/parallel_launches.py):
    # some launch began before another one had its answer.
    started = {e["identity"]: e for e in d.logged("wrapper started")}
    assert len(d.logged("wrapper started")) == 51 and set(started) == {f"{n}-g1-a1" for n in [*names, "marker"]}
    spans = sorted((e["began"], e["answered"]) for n, e in started.items() if n != "marker-g1-a1")
    assert any(b1 < a0 for (_, a0), (b1, _) in zip(spans, spans[1:])), spans[:10]


def test_a_git_pull_in_the_checkout_launches_what_it_brought_in_one_pass(world):
    """The files land before the branch moves: the pass waits for the pull to finish, so it sees
    committed content and launches it (without allow_dirty an uncommitted spec would wait)."""
    clone = world.clone("daemon")
    d = _idle_daemon(world, clone, RECONCILER_DEBOUNCE="0.2", RECONCILER_ALLOW_DIRTY="false",
                     RECONCILER_LOG_LEVEL="DEBUG")
    world.add_spec("pulled", "sleep 60")  # pushed to origin; the daemon does not poll
    git(clone, "pull", "-q", "--ff-only", "origin", "main")
    wait_for(lambda: world.pid_of("pulled-g1-a1"), timeout=30, what="the pulled run to start")
    wait_for(lambda: _local_passes(d), timeout=30, what="its pass to end")
    # One pass, and it launched: one that came before the branch moved would have held the file
    # as uncommitted (a wait), and nothing would have woken another before the resync.
    assert [p["plan"] for p in _local_passes(d)] == [{"launch": 1}], d.text()[-3000:]


def test_one_saved_file_wakes_a_pass_without_waiting_for_the_debounce(world):
    clone = world.clone("daemon")
    d = _idle_daemon(world, clone, RECONCILER_DEBOUNCE="10", RECONCILER_LOG_LEVEL="DEBUG")
    runs = clone / "specs" / "runs"
    (runs / ".single.yaml.tmp").write_text(run_spec("single", "sleep 60"))  # an editor's save: write, rename
    os.replace(runs / ".single.yaml.tmp", runs / "single.yaml")
    wait_for(lambda: world.pid_of("single-g1-a1"), timeout=8, what="the run to start before the 10 s debounce")
    assert "specs/runs/single.yaml" in d.logged("local change")[-1]["paths"]


def test_a_batch_counts_files_not_an_editors_temporaries(tmp_path):
    from reconciler.daemon.watch import ADDED, _files

    kept, temporary, removed = tmp_path / "a.yaml", str(tmp_path / ".a.yaml.tmp"), str(tmp_path / "gone.yaml")
    kept.write_text("x")
    assert _files({(ADDED, temporary), (3, temporary), (ADDED, str(kept))}) == 1  # write and rename: one file
    assert _files({(3, removed)}) == 1  # a file removed is a change
    assert _files({(ADDED, str(kept)), (3, removed)}) == 2
