"""Which checkpoint a relaunch resumes from is a machine's answer, and a machine is not trusted:
the answer is taken only as one of the folders the reconciler asked about plus ``checkpoint-N``,
since it becomes a path in the run's config and, in a container, a read-only mount."""

from __future__ import annotations

from reconciler.engine.resume import checkpoint_reply as _checkpoint_reply

ASKED = ["/w/ns/r-g1-a2/artifacts/output", "/w/ns/r-g1-a1/artifacts/output"]


def test_a_checkpoint_of_a_folder_asked_about_is_taken():
    assert _checkpoint_reply("/w/ns/r-g1-a1/artifacts/output/checkpoint-40\n", ASKED) == \
        "/w/ns/r-g1-a1/artifacts/output/checkpoint-40"


def test_anything_else_a_machine_answers_is_not():
    for reply in ("/etc/checkpoint-1", "/w/ns/r-g1-a1/artifacts/output/../../../../etc/checkpoint-1",
                  "/w/ns/r-g1-a1/artifacts/output/checkpoint-1/../../x",
                  "/w/ns/r-g1-a1/artifacts/output/checkpoint-", "/w/ns/r-g1-a1/artifacts/output/checkpoint-1x",
                  "/w/ns/r-g1-a1/artifacts/output/checkpoint-١٢",  # digits, but not ASCII ones
                  "/w/ns/r-g1-a1/artifacts/output/checkpoint-1\n/w/ns/r-g1-a1/artifacts/output/checkpoint-2",
                  "", "checkpoint-1"):
        assert _checkpoint_reply(reply, ASKED) is None, reply
