"""A minimal Language Server Protocol client: drives a real yaml-language-server over stdio.

Just enough of LSP for the editor tests: initialize, push the ``yaml`` settings an editor would
(answering the server's ``workspace/configuration`` pulls), open documents and collect the
``textDocument/publishDiagnostics`` the server sends for them; completion and hover for a spot check.
JSON-RPC 2.0 messages framed by ``Content-Length`` headers, read by one thread.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Where .ci/install-test-deps.sh installs it (npm install --prefix .ci/node yaml-language-server@VERSION).
SERVER = REPO / ".ci" / "node" / "node_modules" / "yaml-language-server" / "bin" / "yaml-language-server"
INSTALL_HINT = "run .ci/install-test-deps.sh (npm install --prefix .ci/node yaml-language-server)"


def server_problem() -> str | None:
    """Why the real server cannot be started here, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not SERVER.is_file():
        return f"yaml-language-server is not installed at {SERVER.relative_to(REPO)}"
    return None


class LspError(RuntimeError):
    pass


class YamlLanguageServer:
    """One ``yaml-language-server --stdio`` process, for as many documents as a test opens."""

    def __init__(self, root: Path, yaml_settings: dict[str, Any]) -> None:
        self.root = root
        self.settings = {"yaml": yaml_settings, "http": {}, "[yaml]": {}, "editor": {}}
        self.proc = subprocess.Popen(["node", str(SERVER), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=root, env={**os.environ, "NODE_NO_WARNINGS": "1"})
        self._next_id = 0
        self._responses: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.diagnostics: dict[str, list[dict]] = {}
        self._published = threading.Condition()
        self._publish_count: dict[str, int] = {}
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    # ------------------------------------------------------------ wire

    def _send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        with self._lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if length is None:
                continue
            self._dispatch(json.loads(out.read(length)))

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.decode(errors="replace").rstrip())

    def _dispatch(self, msg: dict) -> None:
        if "method" in msg and "id" in msg:  # a request from the server
            self._send({"id": msg["id"], "result": self._answer(msg["method"], msg.get("params"))})
        elif "id" in msg:
            q = self._responses.get(msg["id"])
            if q is not None:
                q.put(msg)
        elif msg.get("method") == "textDocument/publishDiagnostics":
            with self._published:
                uri = msg["params"]["uri"]
                self.diagnostics[uri] = msg["params"]["diagnostics"]
                self._publish_count[uri] = self._publish_count.get(uri, 0) + 1
                self._published.notify_all()
        elif msg.get("method") == "window/logMessage":
            self.log.append(msg["params"].get("message", ""))

    def _answer(self, method: str, params: Any) -> Any:
        if method == "workspace/configuration":
            return [self.settings.get(item.get("section"), None) for item in params["items"]]
        return None  # client/registerCapability, window/workDoneProgress/create, ...

    def request(self, method: str, params: Any, timeout: float = 30) -> Any:
        with self._lock:
            self._next_id += 1
            rid = self._next_id
        q: queue.Queue = queue.Queue()
        self._responses[rid] = q
        self._send({"id": rid, "method": method, "params": params})
        try:
            msg = q.get(timeout=timeout)
        except queue.Empty:
            raise LspError(f"no answer to {method} in {timeout}s; server log:\n" + "\n".join(self.log[-20:])) from None
        finally:
            del self._responses[rid]
        if "error" in msg:
            raise LspError(f"{method}: {msg['error']}")
        return msg.get("result")

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    # ------------------------------------------------------------ the editor's side

    def start(self) -> "YamlLanguageServer":
        uri = self.root.as_uri()
        self.request("initialize", {
            "processId": os.getpid(), "rootUri": uri, "workspaceFolders": [{"uri": uri, "name": self.root.name}],
            "capabilities": {
                "workspace": {"configuration": True, "workspaceFolders": True},
                "textDocument": {"publishDiagnostics": {"relatedInformation": False},
                                 "completion": {"completionItem": {"snippetSupport": False}},
                                 "hover": {"contentFormat": ["plaintext", "markdown"]}},
            },
        }, timeout=60)
        self.notify("initialized", {})
        # What an editor sends once its settings are read; the server answers with workspace/configuration.
        self.notify("workspace/didChangeConfiguration", {"settings": self.settings})
        return self

    def open(self, path: Path, text: str | None = None) -> str:
        uri = path.as_uri()
        text = path.read_text(encoding="utf-8") if text is None else text
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}})
        return uri

    def diagnose(self, paths: list[Path], timeout: float = 60, settle: float = 0.3) -> dict[Path, list[dict]]:
        """Open every file and wait for the diagnostics of each (the last published, once they settle).

        A file that is not UTF-8 is opened as an editor shows it, with replacement characters."""
        uris = {self.open(p, p.read_bytes().decode("utf-8", "replace")): p for p in paths}
        deadline = time.monotonic() + timeout
        with self._published:
            while not all(u in self.diagnostics for u in uris):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [str(p) for u, p in uris.items() if u not in self.diagnostics][:5]
                    raise LspError(f"no diagnostics for {missing}; server log:\n" + "\n".join(self.log[-20:]))
                self._published.wait(left)
        # A schema loaded while a document was validated can trigger a second validation: settle.
        while True:
            before = dict(self._publish_count)
            time.sleep(settle)
            if self._publish_count == before:
                break
        return {p: self.diagnostics[u] for u, p in uris.items()}

    def completion(self, path: Path, line: int, character: int) -> list[dict]:
        result = self.request("textDocument/completion", {"textDocument": {"uri": path.as_uri()},
                                                          "position": {"line": line, "character": character}})
        return result.get("items", []) if isinstance(result, dict) else (result or [])

    def hover(self, path: Path, line: int, character: int) -> str:
        result = self.request("textDocument/hover", {"textDocument": {"uri": path.as_uri()},
                                                     "position": {"line": line, "character": character}})
        if not result:
            return ""
        contents = result["contents"]
        return contents["value"] if isinstance(contents, dict) else str(contents)

    def close(self) -> None:
        try:
            self.request("shutdown", None, timeout=10)
            self.notify("exit", None)
            self.proc.wait(timeout=10)
        except (LspError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
