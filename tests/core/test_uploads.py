"""runtime/uploads.json at the trust boundary: a good report is taken as written; anything shaped
otherwise, anything out of range, and any URI outside the run's own folder of the bucket is
refused with a reason, and never raises anything but BadUploads (fuzzed)."""

from __future__ import annotations

import copy
import json
import random

import pytest

from reconciler.core.boundary import parse_run
from reconciler.core.uploads import BadUploads, parse_uploads

BASE = "bucket1/team/r-abc/sft/g1"
SHA = "0123456789abcdef" * 4


def good() -> dict:
    return {"schema_version": 1,
            "checkpoints": [
                {"name": "checkpoint-10", "uri": f"store:{BASE}/checkpoints/checkpoint-10", "manifest_sha256": SHA,
                 "bytes": 1234, "files": 3, "uploaded_at": 1764115200},
                {"name": "checkpoint-20", "uri": f"store:{BASE}/checkpoints/checkpoint-20", "manifest_sha256": SHA,
                 "bytes": 2345, "files": 3, "uploaded_at": 1764115260.5}],
            "artifacts": {"uri": f"store:{BASE}/a2", "uploaded_at": None, "final": False},
            "resumed_from": {"name": "checkpoint-10", "uri": f"store:{BASE}/checkpoints/checkpoint-10",
                             "manifest_sha256": SHA},
            "error": None}


def test_a_good_report_is_taken_newest_first() -> None:
    up = parse_uploads(good(), BASE)
    assert [c["name"] for c in up["checkpoints"]] == ["checkpoint-20", "checkpoint-10"]
    assert up["artifacts"] == {"uri": f"store:{BASE}/a2", "uploaded_at": None, "final": False}
    assert up["resumed_from"]["name"] == "checkpoint-10" and up["error"] is None
    assert parse_uploads(up, BASE) == up  # what it gives back reads the same again


def bad(mutate) -> dict:
    doc = good()
    mutate(doc)
    return doc


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d["checkpoints"][0].update(uri="store:bucket1/team/r-abc/other/g1/checkpoints/checkpoint-10"),
     "outside this run's folder"),
    (lambda d: d["checkpoints"][0].update(uri=f"store:{BASE}/checkpoints/checkpoint-99"), "not store:"),
    (lambda d: d["checkpoints"][0].update(uri=f"store:{BASE}/../../x/checkpoints/checkpoint-10"), "plain path"),
    (lambda d: d["checkpoints"][0].update(uri=f"other:{BASE}/checkpoints/checkpoint-10"), "not a store: URI"),
    (lambda d: d["checkpoints"][0].update(name="checkpoint-x"), "not checkpoint-N"),
    (lambda d: d["checkpoints"][0].update(name="../checkpoint-1"), "not checkpoint-N"),
    (lambda d: d["checkpoints"][0].update(manifest_sha256="XYZ"), "SHA-256"),
    (lambda d: d["checkpoints"][0].update(bytes=-1), "count in range"),
    (lambda d: d["checkpoints"][0].update(bytes=True), "count in range"),
    (lambda d: d["checkpoints"][0].update(files=10**12), "count in range"),
    (lambda d: d["checkpoints"][0].update(uploaded_at=float("nan")), "not a time"),
    (lambda d: d["checkpoints"][0].update(uploaded_at=1e300), "not a time"),
    (lambda d: d["checkpoints"].append(copy.deepcopy(d["checkpoints"][0])), "listed twice"),
    (lambda d: d.update(checkpoints=[d["checkpoints"][0]] * 65), "at most 64"),
    (lambda d: d["artifacts"].update(uri="store:bucket1/elsewhere/a2"), "outside this run's folder"),
    (lambda d: d["artifacts"].update(final="yes"), "boolean final"),
    (lambda d: d["resumed_from"].update(uri="store:bucket1/someone-else/checkpoints/checkpoint-10"),
     "outside this run's folder"),
    (lambda d: d.update(error=["not", "text"]), "not a string"),
    (lambda d: d.update(checkpoints="all of them"), "not a list"),
])
def test_bad_reports_are_refused_with_their_reason(mutate, why: str) -> None:
    with pytest.raises(BadUploads) as e:
        parse_uploads(bad(mutate), BASE)
    assert why in str(e.value)


def test_a_pinned_checkpoint_of_another_run_may_be_resumed_from() -> None:
    other = "store:bucket1/team/r-abc/base-run/g3/checkpoints/checkpoint-7"
    doc = bad(lambda d: d["resumed_from"].update(uri=other, name="checkpoint-7"))
    with pytest.raises(BadUploads):
        parse_uploads(doc, BASE)
    assert parse_uploads(doc, BASE, pinned=other)["resumed_from"]["uri"] == other


def test_an_error_is_one_clean_line() -> None:
    up = parse_uploads(bad(lambda d: d.update(error="upload failed\x1b[31m: 403\nsecond line")), BASE)
    assert up["error"] == "upload failed [31m: 403"


def test_the_probe_entry_fails_only_the_outputs_reading() -> None:
    """A refused uploads.json leaves the run's own report whole: its state still counts."""
    entry = {"state": "running", "pid": 42, "uploads": bad(lambda d: d.update(schema_version=9))}
    r = parse_run("sft-g1-a2", entry)
    assert r.state == "running" and r.pid == 42 and r.uploads is None
    assert "schema_version" in r.uploads_error
    r = parse_run("sft-g1-a2", {"state": "running", "uploads": good()})
    assert r.uploads_error is None and len(r.uploads["checkpoints"]) == 2
    r = parse_run("sft-g1-a2", {"state": "running", "uploads": "not JSON"})
    assert r.state == "running" and "not an object" in r.uploads_error


def _mutations(doc, rng: random.Random):
    """Random damage to one place of the document: a value replaced by something of another kind."""
    junk = [None, True, -1, 2**70, 1e308, float("inf"), "", "x" * 5000, "store:" + "a/" * 600, [], {}, [1, 2],
            {"name": "checkpoint-1"}, "checkpoint-1", "\u202e\x00", SHA]
    node = doc
    while True:
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return doc
        key = rng.choice(keys)
        child = node[key]
        if isinstance(child, (dict, list)) and child and rng.random() < 0.7:
            node = child
            continue
        node[key] = rng.choice(junk)
        return doc


def test_fuzzed_reports_raise_nothing_but_bad_uploads() -> None:
    rng = random.Random(20261126)
    taken = refused = 0
    for _ in range(3000):
        doc = _mutations(good(), rng)
        try:
            up = parse_uploads(doc, BASE)
        except BadUploads:
            refused += 1
            continue
        taken += 1
        json.dumps(up, allow_nan=False)  # what is taken is plain, finite JSON
        for c in up["checkpoints"]:
            assert c["uri"] == f"store:{BASE}/checkpoints/{c['name']}"
        if up["artifacts"]:
            assert up["artifacts"]["uri"].startswith(f"store:{BASE}/")
    assert taken and refused  # both branches were exercised
