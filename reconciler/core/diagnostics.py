"""Located messages about user files, and the three ways to print them.

Every problem a user can fix is reported as ``file:line:col: message`` so that editors and CI jump
to it. ``--format github`` turns the same diagnostics into GitHub Actions annotations, and
``--format json`` into a machine-readable list.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int  # 1-based; 0 when the problem concerns the whole file
    col: int  # 1-based; 0 when unknown
    message: str

    def text(self) -> str:
        if self.line:
            return f"{self.path}:{self.line}:{self.col or 1}: {self.message}"
        return f"{self.path}: {self.message}"

    def github(self) -> str:
        # Annotation messages are single-line; GitHub decodes %0A as a newline.
        msg = self.message.replace("%", "%25").replace("\r", "").replace("\n", "%0A")
        loc = f"file={self.path}"
        if self.line:
            loc += f",line={self.line},col={self.col or 1}"
        return f"::error {loc}::{msg}"


def relpath(path: Path, root: Path | None) -> str:
    """The path as a user would type it: relative to the repository when inside it."""
    if root is not None:
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(path)


def render(diags: list[Diagnostic], fmt: str, checked: int) -> str:
    diags = sorted(diags)
    if fmt == "json":
        return json.dumps(
            {"valid": not diags, "files_checked": checked, "errors": [asdict(d) for d in diags]},
            indent=2,
        )
    if fmt == "github":
        return "\n".join(d.github() for d in diags)
    lines = [d.text() for d in diags]
    files = len({d.path for d in diags})
    if diags:
        lines.append(f"{len(diags)} error(s) in {files} file(s); {checked} file(s) checked")
    else:
        lines.append(f"ok: {checked} file(s) valid")
    return "\n".join(lines)
