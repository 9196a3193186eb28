"""The plan on a pull request: the job summary, and one comment kept up to date.

``reconcile plan --offline --github`` runs in the pull request's workflow. It appends the plan as
markdown to the file GitHub names in ``$GITHUB_STEP_SUMMARY`` (the run's summary page), and on a
pull request from a branch of the same repository it also keeps one comment on the pull request
up to date: found by a hidden marker, created on the first push, edited in place after, never
duplicated. A fork's pull request gets the summary only: its workflow token cannot write, and the
offline plan needs nothing else.

GitHub's REST API, the calls used (``$GITHUB_API_URL``, token in ``$GITHUB_TOKEN``):
``GET /repos/{repo}/issues/{number}/comments?per_page=100&page=N``,
``POST /repos/{repo}/issues/{number}/comments``, ``PATCH /repos/{repo}/issues/comments/{id}``.
The token only ever goes into the Authorization header; errors name the call and the status.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from reconciler.core import display
from reconciler.core.actions import Action
from reconciler.core.errors import ReconcilerError

MARKER = "<!-- reconcile-plan -->"
MAX_BODY = 60000  # GitHub refuses comments over 65,536 characters
PAGE = 100


def _cell(text) -> str:
    # Names, reasons and warnings can carry what a machine reported (a run's message) or what a
    # pull request wrote: shown as literal text, one line, bounded; no link, image, mention or HTML.
    return display.md(text, 300)


def markdown(plan, offline: bool = True, diagnostics: list[str] | None = None) -> str:
    """The plan as markdown: a table of changes (runs with nothing to do left out), counts, warnings."""
    shown = [c for c in plan.changes if c.action != Action.NONE]
    title = "Reconcile plan" + (" (offline: from the committed status files)" if offline else "")
    lines = [MARKER, f"### {title}", ""]
    if diagnostics:
        lines += ["**Invalid specs**", ""] + [f"- {_cell(d)}" for d in diagnostics] + [""]
    if not shown:
        lines.append("No changes: merging this changes nothing on the machines.")
    else:
        counts = plan.summary()
        lines.append("**" + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()) if a != Action.NONE) + "**")
        rented, price = plan.new_rentals()
        if rented:
            lines += ["", f"New rentals: {rented}, estimated **{price:g} per hour**."]
        lines += ["", "| | run | action | where | why |", "|---|---|---|---|---|"]
        for c in shown:
            where = c.identity or ""
            if c.machine:
                where += f" on {c.machine}"
            if c.kill:
                where += " (stop " + ", ".join(k.identity for k in c.kill) + ")"
            lines.append(f"| `{_sym(c.action)}` | {_cell(c.name)} | {c.action} | {_cell(where)} | "
                         f"{_cell(c.code)}: {_cell(c.reason)} |")
    if plan.warnings:
        lines += ["", "**Warnings**", ""] + [f"- {_cell(w)}" for w in plan.warnings]
    text = "\n".join(lines) + "\n"
    if len(text) > MAX_BODY:
        text = text[:MAX_BODY] + "\n\n… (cut: the whole plan is in the job's log)\n"
    return text


def _sym(action: str) -> str:
    from reconciler.planner.render import SYMBOL

    return SYMBOL.get(action, "?")


class GitHub:
    def __init__(self, api_url: str, repo: str, token: str, timeout: float = 20.0):
        self.api, self.repo, self._token, self.timeout = api_url.rstrip("/"), repo, token, timeout

    def _call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(self.api + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/vnd.github+json")
        req.add_header("X-GitHub-Api-Version", "2022-11-28")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise ReconcilerError(f"GitHub {method} {path}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ReconcilerError(f"GitHub {method} {path}: {getattr(e, 'reason', e)}") from None

    def upsert_comment(self, number: int, body: str) -> tuple[str, int]:
        """Create the marked comment, or edit it. Returns (created|updated|unchanged, comment id)."""
        page = 1
        while True:
            items = self._call("GET", f"/repos/{self.repo}/issues/{number}/comments?per_page={PAGE}&page={page}")
            if not isinstance(items, list):
                raise ReconcilerError(f"GitHub: the comments of #{number} are not a list")
            for c in items:
                if isinstance(c, dict) and MARKER in str(c.get("body") or ""):
                    if c.get("body") == body:
                        return "unchanged", c["id"]
                    self._call("PATCH", f"/repos/{self.repo}/issues/comments/{c['id']}", {"body": body})
                    return "updated", c["id"]
            if len(items) < PAGE:
                break
            page += 1
        made = self._call("POST", f"/repos/{self.repo}/issues/{number}/comments", {"body": body})
        return "created", made["id"]


GITHUB_VARS = ("GITHUB_STEP_SUMMARY", "GITHUB_EVENT_PATH", "GITHUB_TOKEN", "GITHUB_API_URL", "GITHUB_REPOSITORY")


def report(body: str, env: dict[str, str] | None = None) -> list[str]:
    """Post ``body`` where the workflow's environment says: the step summary, and the pull request's
    comment unless it comes from a fork. Returns what was done, one line each, for the log."""
    # Only the workflow's variables this needs, by name (GITHUB_TOKEN among them); it starts no process.
    src = os.environ if env is None else env
    env = {k: src[k] for k in GITHUB_VARS if k in src}
    done = []
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(body)
        done.append(f"summary: appended to {summary}")
    event = _event(env.get("GITHUB_EVENT_PATH"))
    pr = event.get("pull_request") if isinstance(event, dict) else None
    if not isinstance(pr, dict):
        done.append("comment: not a pull request event")
        return done
    head = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
    base = ((pr.get("base") or {}).get("repo") or {}).get("full_name")
    if head != base:
        done.append(f"comment: skipped, the pull request comes from a fork ({head})")
        return done
    token = env.get("GITHUB_TOKEN")
    if not token:
        done.append("comment: skipped, no GITHUB_TOKEN")
        return done
    number = pr.get("number")
    if isinstance(number, bool) or not isinstance(number, int):
        raise ReconcilerError(f"{env.get('GITHUB_EVENT_PATH')}: the pull request event has no number")
    gh = GitHub(env.get("GITHUB_API_URL", "https://api.github.com"), env.get("GITHUB_REPOSITORY") or base, token)
    what, cid = gh.upsert_comment(number, body)
    done.append(f"comment: {what} ({cid}) on #{pr['number']}")
    return done


def untrusted_body(text: str) -> str:
    """A plan computed by a pull request's own code (the plan job's artifact), made fit to post
    with a write token: bounded, one marker line first (so it is found and edited, never
    duplicated), no control characters, and no "@" that would mention someone as the bot. Its
    markdown stays: the table is what it shows, and it claims nothing the pull request's author
    could not write in a comment of their own."""
    text = "".join(ch for ch in text[:MAX_BODY] if ch in "\n\t" or (ch >= " " and ch != "\x7f"))
    text = text.replace(MARKER, "").replace("@", "@\u200b").lstrip("\n")
    return f"{MARKER}\n{text}" + ("" if text.endswith("\n") else "\n")


def post_artifact(path: str, env: dict[str, str] | None = None) -> list[str]:
    """The trusted half of the plan workflow: post the plan file ``path`` (made by the untrusted
    job) as the pull request's comment. The pull request comes from this workflow's own event,
    never from the file; nothing here writes the job summary (the plan job did)."""
    env = dict(os.environ if env is None else env)
    env.pop("GITHUB_STEP_SUMMARY", None)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(MAX_BODY + 1)
    except OSError as e:
        raise ReconcilerError(f"{path}: cannot read the plan: {e.strerror}") from None
    return report(untrusted_body(text), env)


def _event(path: str | None) -> dict:
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReconcilerError(f"{path}: cannot read the GitHub event: {e}") from None


if __name__ == "__main__":  # python -m reconciler.cli.prcomment PLAN.md (the plan workflow's comment job)
    import sys

    try:
        for line in post_artifact(sys.argv[1]):
            print(line)
    except (IndexError, ReconcilerError) as e:
        print(f"reconcile plan comment: {e if isinstance(e, ReconcilerError) else 'usage: PLAN.md'}", file=sys.stderr)
        sys.exit(1)
