"""The live page: a read-only view of the runs, served by the daemon on its own port.

Off by default (``dashboard_listen: HOST:PORT`` in the configuration). Server-rendered HTML from the
status files the daemon writes anyway, so it adds no load on the machines: a page is a read of
``status/`` (through the status cache: unchanged files are not parsed again). No build step, no
CDN, nothing fetched from elsewhere: the loss curve is the ledger's SVG, drawn here, and the only
script is a few lines, served as ``/static/page.js`` (so the Content-Security-Policy allows no
inline script at all), that refresh the log tail with ``textContent``.

Pages: ``/`` the runs (filter by phase, name and machine), ``/runs/NAME`` one run (status,
conditions, history, loss curve, provenance, log tail), ``/runs/NAME/log`` the tail as plain text,
``/machines`` what the status files say of each machine. Everything that comes from a spec, a
status or a log is escaped; a GET is all it answers (other methods get 405), and no page changes
anything.

The log tail is read where it can be without SSH: the workspace of a run on this machine, or the
copy collected after a remote run; a remote run still running says where to follow it.

A status file's workspace is not trusted: it came from a machine's report, and anyone who can
push to the repository can write one. So the page reads a log only inside the bundle store and the
local workspace root, and never through a link: from the store's root down, each component is
opened with ``O_NOFOLLOW`` relative to the one above (a symlink anywhere, a ``..``, a path outside
the roots: refused), the file must be a regular file (``fstat`` on the opened descriptor), and at
most ``TAIL_BYTES`` are read. A refused file shows as "not available", never as its content.
"""

from __future__ import annotations

import errno
import html
import json
import logging
import os
import re
import stat
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

from reconciler.core import display
from reconciler.core.runstatus import TERMINAL, cost_so_far
from reconciler.status import ledger, store as statuses

from . import gpuchart
from reconciler.spec.models.common import is_dns_label

log = logging.getLogger("reconciler.dashboard")
TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
AUDIT_BYTES, AUDIT_LINES = 2 << 20, 20_000  # the NVML audit's tail the GPU charts are drawn from
# The page's only script, a file of its own so that no inline script is ever allowed. Every 2 s it
# refreshes the log tail (textContent, never innerHTML: a log line is text, whatever it holds) and
# the page's live parts (phase, progress, curves, conditions, history, cost): it fetches the same
# page and swaps each element marked data-live for its fresh copy. The fresh copy is the server's
# own escaped HTML, parsed by DOMParser, whose scripts never run (and the CSP allows none inline).
SCRIPT = """(function () {
  var p = document.getElementById('log');
  if (p) {
    setInterval(function () {
      fetch(location.pathname + '/log').then(function (r) { return r.text(); }).then(function (t) {
        if (p.textContent !== t) { p.textContent = t; p.scrollTop = p.scrollHeight; }
      });
    }, 2000);
  }
  if (!document.querySelector('[data-live]')) { return; }
  setInterval(function () {
    fetch(location.href, {cache: 'no-store'}).then(function (r) { return r.ok ? r.text() : null; }).then(function (t) {
      if (!t) { return; }
      var doc = new DOMParser().parseFromString(t, 'text/html');
      document.querySelectorAll('[data-live]').forEach(function (el) {
        var fresh = el.id ? doc.getElementById(el.id) : null;
        if (fresh && fresh.outerHTML !== el.outerHTML) { el.replaceWith(document.importNode(fresh, true)); }
      });
    });
  }, 2000);
})();
"""
STATIC = {"/static/page.js": "text/javascript; charset=utf-8", "/static/page.css": "text/css; charset=utf-8"}
# Scripts and styles from this origin's files only (no inline script, no eval), requests only to
# itself, no frames, no <base>, forms only to itself.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2328}
table{border-collapse:collapse;margin:.5rem 0 1rem}
th,td{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f6f8fa} a{color:#0969da;text-decoration:none} nav a{margin-right:1rem}
.Running{color:#1a7f37}.Failed,.Invalid{color:#cf222e}.Pending,.Unknown{color:#9a6700}
pre{background:#f6f8fa;padding:.6rem;max-height:28rem;overflow:auto;white-space:pre-wrap}
form input,form select{margin-right:.5rem}
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def cell(value, limit: int = 2000) -> str:
    """A value from a status file in a table cell: one line, no control or bidi characters, bounded."""
    return display.html_text(value, limit)


def page(title: str, body: str) -> bytes:
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(title)}</title><link rel=stylesheet href=\"/static/page.css\"></head><body>"
            "<nav><a href=\"/\">Runs</a><a href=\"/machines\">Machines</a></nav>"
            f"<h1 id=title data-live>{esc(title)}</h1>{body}"
            "<script src=\"/static/page.js\" defer></script></body></html>").encode("utf-8", "replace")


class Views:
    """The pages, from the repository's status files and the local bundle store."""

    def __init__(self, repo: Path, state_dir: Path, workspace_roots: list[str | Path] = ()):
        """``workspace_roots``: where runs on this machine (machine ``local``) keep their
        workspaces; with the bundle store, the only places a log is read from."""
        self.status_dir = repo / "status"
        self.state_dir = state_dir
        self.bundles = state_dir / "bundles"
        self.roots = [self.bundles] + [Path(r) for r in workspace_roots]
        self.cache = statuses.StatusCache()

    def load(self) -> dict[str, statuses.RunStatus]:
        return statuses.load_with_live(self.status_dir, self.state_dir, self.cache)

    def runs(self, query: dict[str, list[str]]) -> bytes:
        want_phase = (query.get("phase") or [""])[0]
        want_name = (query.get("q") or [""])[0].strip().lower()
        want_machine = (query.get("machine") or [""])[0]
        every = self.load()
        rows = []
        for name, st in sorted(every.items(), key=lambda kv: _since(kv[1]), reverse=True):
            machine = st.handle.machine if st.handle and st.handle.machine else ""
            if (want_phase and st.phase != want_phase) or (want_name and want_name not in name) or (
                    want_machine and machine != want_machine):
                continue
            p = st.progress if isinstance(st.progress, dict) else {}
            progress = ledger.progress_text(p)
            spark = ledger.sparkline(ledger.curve_losses(st.loss_curve))
            loss = display.number(p["loss"]) if p.get("loss") is not None else ""
            rows.append(f"<tr><td><a href=\"/runs/{quote(name)}\">{esc(name)}</a></td>"
                        f"<td class=\"{esc(st.phase)}\">{esc(st.phase)}</td><td>{st.generation}/{st.attempt}</td>"
                        f"<td>{esc(progress)}</td><td>{esc(spark)} {esc(loss)}</td>"
                        f"<td>{cell(machine)}</td><td>{cell(_cost(st) or '')}</td><td>{cell(_since(st))}</td>"
                        f"<td>{display.html_text(st.message, 160)}</td></tr>")
        phases = sorted({st.phase for st in every.values()})
        machines = sorted({st.handle.machine for st in every.values() if st.handle and st.handle.machine})
        form = ("<form method=get action=\"/\">"
                + _select("phase", phases, want_phase) + _select("machine", machines, want_machine)
                + f"<input name=q placeholder=\"name contains\" value=\"{esc(want_name)}\">"
                "<button type=submit>Filter</button></form>")
        table = ("<table id=runs data-live><tr><th>run</th><th>phase</th><th>gen/att</th><th>progress</th><th>loss</th>"
                 "<th>machine</th><th>cost</th><th>since</th><th>message</th></tr>" + "".join(rows) + "</table>")
        return page(f"Runs ({len(rows)} of {len(every)})", form + table)

    def run(self, name: str) -> bytes | None:
        st = self.load().get(name)
        if st is None:
            return None
        h = st.handle
        facts = [("phase", st.phase), ("generation / attempt", f"{st.generation} / {st.attempt}"),
                 ("message", st.message), ("exit code", st.exit_code), ("machine", h.machine if h else None),
                 ("identity", h.identity if h else None), ("GPUs", ",".join(map(str, h.gpus)) if h else None),
                 ("spec", f"{st.spec.path or ''} {st.spec.digest or ''}".strip()), ("spec commit", st.spec.commit),
                 ("price per hour", _num((st.cost or {}).get("price_per_hour"))),
                 ("cost so far", _cost(st)),
                 ("rental", f"{h.rental.get('provider')}/{h.rental.get('offer')} ({h.rental.get('name')})"
                  if h is not None and h.rental else None)]
        facts += list(zip(("outputs", "newest checkpoint"), ledger.outputs_of(st)))  # reconcile artifacts NAME
        body = ["<table id=facts data-live>"] + [f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in facts
                                       if v not in (None, "")] + ["</table>"]
        curve = ledger.svg(name, st.loss_curve) if len(ledger.curve_points(st.loss_curve)) >= 2 else "<p>No curve yet.</p>"
        body += ["<h2>Loss</h2>", f"<div id=curve data-live>{curve}</div>",
                 "<h2>GPUs</h2>", f"<div id=gpu data-live>{self.gpus(st)}</div>"]
        body += ["<h2>Conditions</h2><table id=conditions data-live><tr><th>type</th><th>status</th><th>reason</th><th>message</th>"
                 "<th>since</th></tr>"]
        body += [f"<tr><td>{cell(c.type)}</td><td>{cell(c.status)}</td><td>{cell(c.reason)}</td><td>{cell(c.message)}"
                 f"</td><td>{cell(c.last_transition)}</td></tr>" for c in st.conditions] + ["</table>"]
        body += ["<h2>History</h2><table id=history data-live><tr><th>time</th><th>phase</th><th>gen/att</th><th>reason</th></tr>"]
        body += [f"<tr><td>{cell(t.time)}</td><td>{cell(t.phase)}</td><td>{t.generation}/{t.attempt}</td>"
                 f"<td>{cell(t.reason)}</td></tr>" for t in reversed(st.history)] + ["</table>"]
        body += ["<h2>Log tail</h2>", f"<pre id=log>{esc(self.tail(st))}</pre>"]
        if st.provenance:
            body += ["<h2>Provenance</h2>", f"<pre id=provenance>{esc(json.dumps(st.provenance, indent=2))}</pre>"]
        return page(name, "".join(body))

    def gpus(self, st: statuses.RunStatus) -> str:
        """The GPU charts from the run's NVML audit, read like its log (local workspace or collected copy)."""
        h = st.handle
        if h is None or not h.identity:
            return "<p>Not launched yet.</p>"
        bases = ([str(h.workspace)] if h.machine == "local" and h.workspace else []) + [str(self.bundles / h.identity)]
        for base in bases:
            text = tail_file(os.path.join(base, "artifacts", "nvml-audit.jsonl"), self.roots, AUDIT_BYTES, AUDIT_LINES)
            if text:
                return gpuchart.charts(text)
        return "<p>No GPU telemetry here (a remote run's audit is collected when it ends).</p>"

    def tail(self, st: statuses.RunStatus) -> str:
        h = st.handle
        if h is None or not h.identity:
            return "(not launched yet)"
        where = []
        if h.machine == "local" and h.workspace:
            where.append(str(h.workspace))
        where.append(str(self.bundles / h.identity))
        for base in where:
            chunks = []
            for f in ("stdout.log", "stderr.log"):
                text = tail_file(os.path.join(base, "artifacts", f), self.roots)
                if text is None:
                    chunks.append(f"==> {f} <==\n(not available: the page reads only regular files inside "
                                  "the bundle store and the local workspace root, never through a link)")
                elif text:
                    chunks.append(f"==> {f} <==\n{text}")
            if chunks:
                return "\n".join(chunks)
        if h.machine and h.machine != "local" and st.phase not in TERMINAL:
            return f"(runs on {h.machine}: its log is collected when it ends; follow it now with " \
                   f"`reconcile logs {st.name} -f`)"
        return "(no log yet)"

    def machines(self) -> bytes:
        by: dict[str, dict] = {}
        for st in self.load().values():
            if st.handle is None or not st.handle.machine:
                continue
            m = by.setdefault(st.handle.machine, {"live": 0, "runs": 0, "reach": ""})
            m["runs"] += 1
            if st.phase not in TERMINAL and st.phase != "Pending":
                m["live"] += 1
                c = st.condition("MachineReachable")
                if c is not None and c.status == "False":
                    m["reach"] = c.message
        rows = "".join(f"<tr><td>{cell(n)}</td><td>{m['live']}</td><td>{m['runs']}</td>"
                       f"<td>{cell(m['reach'] or 'answering')}</td></tr>" for n, m in sorted(by.items()))
        return page("Machines", "<p>As the status files last recorded them (<code>reconcile status --machines"
                    "</code> asks each machine now).</p><table id=machines data-live><tr><th>machine</th><th>live runs</th>"
                    f"<th>runs recorded</th><th>last seen</th></tr>{rows}</table>")


def _since(st: statuses.RunStatus) -> str:
    return st.history[-1].time if st.history else (st.observed_at or "")


def _select(name: str, options: list[str], chosen: str) -> str:
    opts = [f"<option value=\"\">any {esc(name)}</option>"]
    opts += [f"<option value=\"{esc(o)}\"{' selected' if o == chosen else ''}>{esc(o)}</option>" for o in options]
    return f"<select name={name}>{''.join(opts)}</select>"


def _num(value) -> str | None:
    return None if value is None else display.number(value)


def _cost(st: statuses.RunStatus) -> str | None:
    if not st.cost:
        return None
    try:
        return display.number(cost_so_far(st, time.time()), 6)
    except (TypeError, ValueError, OverflowError):  # a cost field that is not a number
        return "?"


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO opens at once (and is then refused by fstat) instead of waiting for a writer.
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def open_inside(path: str, roots: list[Path]) -> int | None:
    """A read-only descriptor of the regular file ``path``, or None when it is not one reached
    from one of ``roots`` without a link. The root itself is the configuration's (resolved here);
    below it, each directory is opened with ``O_NOFOLLOW`` relative to its parent, so a link, a
    ``..`` or a directory swapped for a link meanwhile cannot lead outside. Raises
    FileNotFoundError when the file (or a folder above it) does not exist."""
    if "\x00" in path or not os.path.isabs(path) or os.pardir in path.split(os.sep):
        return None  # "a/../b": not how the reconciler names a workspace
    target = os.path.normpath(path)
    for root in roots:
        root_real = os.path.realpath(root)
        for base in dict.fromkeys((os.path.normpath(os.path.abspath(root)), root_real)):
            if not target.startswith(base.rstrip(os.sep) + os.sep):
                continue
            parts = target[len(base.rstrip(os.sep)) + 1:].split(os.sep)
            if any(p in ("", os.curdir, os.pardir) for p in parts):
                return None
            return _walk(root_real, parts)
    return None


def _walk(root_real: str, parts: list[str]) -> int | None:
    try:
        fd = os.open(root_real, _OPEN_DIR)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    raise
                return None  # ELOOP (a link), ENOTDIR, EACCES: not a way the page goes
            os.close(fd)
            fd = nxt
        try:
            f = os.open(parts[-1], _OPEN_FILE, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise
            return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(f).st_mode):
        os.close(f)
        return None
    return f


def tail_file(path: str, roots: list[Path], max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> str | None:
    """The last lines of a log inside ``roots`` (at most ``TAIL_BYTES`` read); "" when there is
    none; None when the path is one the page refuses (see ``open_inside``)."""
    try:
        fd = open_inside(path, roots)
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, min(size, max_bytes), start)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first one is cut
    # Terminal escapes and other controls: shown by a browser as boxes, acted on by a terminal that
    # prints /runs/NAME/log; tabs and newlines stay.
    return "\n".join(_TERMINAL_CONTROLS.sub("", line) for line in lines[-max_lines:])


_RUN = re.compile(r"^/runs/([^/]+)(/log)?$")


def make_server(listen: str, views: Views) -> ThreadingHTTPServer:
    from .httpd import BoundedHandler, _Server, parse_listen

    class Handler(BoundedHandler):
        def log_message(self, fmt: str, *args) -> None:
            log.debug("dashboard %s", fmt % args)

        def _send(self, code: int, body: bytes, ctype: str = "text/html; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            try:
                self._get()
            except Exception:  # noqa: BLE001 - one odd status file must not take the page down
                log.exception("dashboard: error while rendering %s", self.path[:200])
                self.close_connection = True
                self._send(500, page("Error", "<p>This page could not be rendered; the daemon's log says why.</p>"))

        def _get(self) -> None:
            u = urlparse(self.path)
            if u.path in STATIC:
                return self._send(200, (SCRIPT if u.path.endswith(".js") else STYLE).encode(), STATIC[u.path])
            if u.path == "/":
                return self._send(200, views.runs(parse_qs(u.query)))
            if u.path == "/machines":
                return self._send(200, views.machines())
            m = _RUN.match(u.path)
            if m and is_dns_label(m.group(1)):
                if m.group(2):
                    st = views.load().get(m.group(1))
                    if st is not None:
                        return self._send(200, views.tail(st).encode("utf-8", "replace"), "text/plain; charset=utf-8")
                else:
                    body = views.run(m.group(1))
                    if body is not None:
                        return self._send(200, body)
            self._send(404, page("Not found", "<p>No such page or run.</p>"))

        do_HEAD = do_GET

        def _refuse(self) -> None:
            self.close_connection = True
            self._send(405, page("Read-only", "<p>This page changes nothing.</p>"))

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    host, port = parse_listen(listen)
    return _Server((host, port), Handler)
