"""The live page: a read-only view of the runs, served by the daemon on its own port.

Off by default (``dashboard_listen: HOST:PORT`` in the configuration). Server-rendered HTML from the
status files the daemon writes anyway, so it adds no load on the machines: a page is a read of
``status/`` (through the status cache: unchanged files are not parsed again). No build step, no
CDN, nothing fetched from elsewhere: the loss curve is the ledger's SVG, drawn here, and the only
script is a few lines that refresh the log tail with ``textContent``.

Pages: ``/`` the runs (filter by phase, name and machine), ``/runs/NAME`` one run (status,
conditions, history, loss curve, provenance, log tail), ``/runs/NAME/log`` the tail as plain text,
``/machines`` what the status files say of each machine. Everything that comes from a spec, a
status or a log is escaped; a GET is all it answers (other methods get 405), and no page changes
anything.

The log tail is read where it can be without SSH: the workspace of a run on this machine, or the
copy collected after a remote run; a remote run still running says where to follow it.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

from . import ledger, status as statuses
from .spec.models import is_dns_label

log = logging.getLogger("reconciler.dashboard")
TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
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


def page(title: str, body: str) -> bytes:
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            "<nav><a href=\"/\">Runs</a><a href=\"/machines\">Machines</a></nav>"
            f"<h1>{esc(title)}</h1>{body}</body></html>").encode()


class Views:
    """The pages, from the repository's status files and the local bundle store."""

    def __init__(self, repo: Path, state_dir: Path):
        self.status_dir = repo / "status"
        self.bundles = state_dir / "bundles"
        self.cache = statuses.StatusCache()

    def load(self) -> dict[str, statuses.RunStatus]:
        return statuses.load_all(self.status_dir, self.cache)

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
            p = st.progress or {}
            progress = f"{p.get('step')}/{p.get('max_steps')}" if p.get("step") is not None else ""
            spark = ledger.sparkline([pt[1] for pt in st.loss_curve])
            rows.append(f"<tr><td><a href=\"/runs/{quote(name)}\">{esc(name)}</a></td>"
                        f"<td class=\"{esc(st.phase)}\">{esc(st.phase)}</td><td>{st.generation}/{st.attempt}</td>"
                        f"<td>{esc(progress)}</td><td>{esc(spark)} {esc(p.get('loss', ''))}</td>"
                        f"<td>{esc(machine)}</td><td>{esc(_since(st))}</td><td>{esc(st.message[:160])}</td></tr>")
        phases = sorted({st.phase for st in every.values()})
        machines = sorted({st.handle.machine for st in every.values() if st.handle and st.handle.machine})
        form = ("<form method=get action=\"/\">"
                + _select("phase", phases, want_phase) + _select("machine", machines, want_machine)
                + f"<input name=q placeholder=\"name contains\" value=\"{esc(want_name)}\">"
                "<button type=submit>Filter</button></form>")
        table = ("<table id=runs><tr><th>run</th><th>phase</th><th>gen/att</th><th>progress</th><th>loss</th>"
                 "<th>machine</th><th>since</th><th>message</th></tr>" + "".join(rows) + "</table>")
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
                 ("price per hour", (st.cost or {}).get("price_per_hour")),
                 ("cost so far", f"{statuses.cost_so_far(st, time.time()):.4f}" if st.cost else None),
                 ("rental", f"{h.rental.get('provider')}/{h.rental.get('offer')} ({h.rental.get('name')})"
                  if h is not None and h.rental else None)]
        body = ["<table id=facts>"] + [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts
                                       if v not in (None, "")] + ["</table>"]
        if len(st.loss_curve) >= 2:
            body += ["<h2>Loss</h2>", f"<div id=curve>{ledger.svg(name, st.loss_curve)}</div>"]
        body += ["<h2>Conditions</h2><table><tr><th>type</th><th>status</th><th>reason</th><th>message</th>"
                 "<th>since</th></tr>"]
        body += [f"<tr><td>{esc(c.type)}</td><td>{esc(c.status)}</td><td>{esc(c.reason)}</td><td>{esc(c.message)}"
                 f"</td><td>{esc(c.last_transition)}</td></tr>" for c in st.conditions] + ["</table>"]
        body += ["<h2>History</h2><table><tr><th>time</th><th>phase</th><th>gen/att</th><th>reason</th></tr>"]
        body += [f"<tr><td>{esc(t.time)}</td><td>{esc(t.phase)}</td><td>{t.generation}/{t.attempt}</td>"
                 f"<td>{esc(t.reason)}</td></tr>" for t in reversed(st.history)] + ["</table>"]
        body += ["<h2>Log tail</h2>", f"<pre id=log>{esc(self.tail(st))}</pre>",
                 # textContent, never innerHTML: a log line is text, whatever it holds.
                 "<script>setInterval(function(){fetch(location.pathname+'/log').then(function(r){return r.text()})"
                 ".then(function(t){var p=document.getElementById('log');if(p.textContent!==t){p.textContent=t;"
                 "p.scrollTop=p.scrollHeight}})},2000)</script>"]
        if st.provenance:
            body += ["<h2>Provenance</h2>", f"<pre id=provenance>{esc(json.dumps(st.provenance, indent=2))}</pre>"]
        return page(name, "".join(body))

    def tail(self, st: statuses.RunStatus) -> str:
        h = st.handle
        if h is None or not h.identity:
            return "(not launched yet)"
        where = []
        if h.machine == "local" and h.workspace:
            where.append(Path(h.workspace))
        where.append(self.bundles / h.identity)
        for base in where:
            chunks = []
            for f in ("stdout.log", "stderr.log"):
                text = _tail_file(base / "artifacts" / f)
                if text:
                    chunks.append(f"==> {f} <==\n{text}")
            if chunks:
                return "\n".join(chunks)
        if h.machine and h.machine != "local" and st.phase not in statuses.TERMINAL:
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
            if st.phase not in statuses.TERMINAL and st.phase != "Pending":
                m["live"] += 1
                c = st.condition("MachineReachable")
                if c is not None and c.status == "False":
                    m["reach"] = c.message
        rows = "".join(f"<tr><td>{esc(n)}</td><td>{m['live']}</td><td>{m['runs']}</td>"
                       f"<td>{esc(m['reach'] or 'answering')}</td></tr>" for n, m in sorted(by.items()))
        return page("Machines", "<p>As the status files last recorded them (<code>reconcile status --machines"
                    "</code> asks each machine now).</p><table id=machines><tr><th>machine</th><th>live runs</th>"
                    f"<th>runs recorded</th><th>last seen</th></tr>{rows}</table>")


def _since(st: statuses.RunStatus) -> str:
    return st.history[-1].time if st.history else (st.observed_at or "")


def _select(name: str, options: list[str], chosen: str) -> str:
    opts = [f"<option value=\"\">any {esc(name)}</option>"]
    opts += [f"<option value=\"{esc(o)}\"{' selected' if o == chosen else ''}>{esc(o)}</option>" for o in options]
    return f"<select name={name}>{''.join(opts)}</select>"


def _tail_file(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:])


_RUN = re.compile(r"^/runs/([^/]+)(/log)?$")


def make_server(listen: str, views: Views) -> ThreadingHTTPServer:
    from .httpd import _Server, parse_listen

    class Handler(BaseHTTPRequestHandler):
        server_version = "reconciler"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:
            log.debug("dashboard %s", fmt % args)

        def _send(self, code: int, body: bytes, ctype: str = "text/html; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            # Only this page's own inline script and SVG: nothing loads from elsewhere.
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                             "script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            u = urlparse(self.path)
            if u.path == "/":
                return self._send(200, views.runs(parse_qs(u.query)))
            if u.path == "/machines":
                return self._send(200, views.machines())
            m = _RUN.match(u.path)
            if m and is_dns_label(m.group(1)):
                if m.group(2):
                    st = views.load().get(m.group(1))
                    if st is not None:
                        return self._send(200, views.tail(st).encode(), "text/plain; charset=utf-8")
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
