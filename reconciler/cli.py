"""The command line, and nothing else: parse arguments, call the package, choose the exit code.

Exit codes: 0 success, 1 invalid specs or a failed check, 2 usage or I/O error. A user error is a
message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .diagnostics import render
from .errors import ReconcilerError, UsageError

SUBCOMMANDS = ("validate", "schema", "plan", "status", "logs", "provenance", "config")


def _repo_root(start: Path) -> Path:
    """The repository a path belongs to: the nearest ancestor with specs/, execution_templates/ or .git."""
    from .spec.load import is_spec_repo

    p = start.resolve()
    if p.is_file():
        p = p.parent
    for cand in (p, *p.parents):
        if is_spec_repo(cand) or (cand / ".git").exists():
            return cand
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    from .spec.load import is_spec_repo, load_tree, yaml_files

    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            print(f"reconcile validate: {p}: no such file or directory", file=sys.stderr)
            return 2
    root = Path(args.repo).resolve() if args.repo else _repo_root(paths[0] if paths else Path.cwd())
    only: set[Path] | None = None
    if paths:
        only = set()
        for p in paths:
            only.update(f.resolve() for f in (yaml_files(p) if p.is_dir() else [p]))
        if not only:
            print(f"reconcile validate: no .yaml files under {', '.join(map(str, paths))}", file=sys.stderr)
            return 2
    elif not is_spec_repo(root):
        print(f"reconcile validate: {root}: no specs/ or execution_templates/ here (use --repo DIR)", file=sys.stderr)
        return 2
    desired = load_tree(root, only=only)
    checked = len(only) if only is not None else len(desired.files)
    out = render(desired.diagnostics, args.format, checked)
    if out:
        print(out)
    return 1 if desired.diagnostics else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .spec import schema

    repo = Path(args.repo or ".")
    if not repo.is_dir():
        print(f"reconcile schema: {repo}: no such directory", file=sys.stderr)
        return 2
    directory = repo.resolve() / "schemas"
    if args.check:
        bad = schema.drift(directory)
        for name in bad:
            print(f"schemas/{name}: differs from the models; run 'reconcile schema' and commit the result")
        if not bad:
            print("ok: schemas/ matches the models")
        return 1 if bad else 0
    written = schema.write(directory)
    for name in written:
        print(f"wrote schemas/{name}")
    if not written:
        print("schemas/ is up to date")
    return 0


def _add_loop_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", help="repository to reconcile (default: the current directory)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--config", help="configuration file (default: reconciler.yaml in the repository, if present)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="reconcile",
        description="Make the machines match the run specs in a git repository, and commit what happened.",
        epilog="subcommands: " + ", ".join(SUBCOMMANDS) + " (reconcile SUBCOMMAND --help)",
    )
    _add_loop_flags(p)
    p.add_argument("--once", action="store_true", help="run one pass and exit")
    p.add_argument("--dry-run", action="store_true", help="with --once: print the plan, change nothing")
    p.add_argument("--no-commit", action="store_true", help="write status files but do not commit them")
    p.add_argument("--log-format", choices=["text", "json"], default=None, help="daemon log format")
    p.add_argument("--poll-interval", type=float, default=None, help="daemon: seconds between git fetches")
    p.add_argument("--resync-interval", type=float, default=None, help="daemon: seconds between full passes")
    p.add_argument("--listen", default=None, help="daemon: HOST:PORT for /healthz, /metrics and /hooks/git")
    return p


def build_subparser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"reconcile {name}")
    if name == "validate":
        p.description = "Check specs, templates and fleets. Exit 0 valid, 1 invalid, 2 usage or I/O error."
        p.add_argument("paths", nargs="*", help="files or folders (default: the whole repository)")
        p.add_argument("--format", choices=["text", "json", "github"], default="text")
        p.add_argument("--repo", help="repository root (default: found from the paths or the current directory)")
    elif name == "schema":
        p.description = "Write schemas/*.schema.json from the models, or --check that they did not drift."
        p.add_argument("--check", action="store_true")
        p.add_argument("--repo")
    elif name == "plan":
        p.description = "Print what one pass would do (the same as --once --dry-run)."
        _add_loop_flags(p)
    elif name == "status":
        p.description = "The runs' status as a table."
        p.add_argument("name", nargs="?")
        _add_loop_flags(p)
    elif name == "logs":
        p.description = "Print a run's logs, wherever it runs."
        p.add_argument("name")
        p.add_argument("--follow", "-f", action="store_true")
        p.add_argument("--stream", choices=["stdout", "stderr", "both"], default="both")
        p.add_argument("--lines", "-n", type=int, default=100)
        _add_loop_flags(p)
    elif name == "provenance":
        p.description = "Print a run's provenance manifest, or --diff it against another run's."
        p.add_argument("name")
        p.add_argument("--diff", metavar="OTHER")
        _add_loop_flags(p)
    elif name == "config":
        p.description = "Print the effective configuration, secrets redacted."
        _add_loop_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            name = argv.pop(0)
            args = build_subparser(name).parse_args(argv)
            return _dispatch(name, args)
        args = build_parser().parse_args(argv)
        if args.dry_run and not args.once:
            print("reconcile: --dry-run needs --once (or use 'reconcile plan')", file=sys.stderr)
            return 2
        return _dispatch("once" if args.once else "daemon", args)
    except UsageError as e:
        print(f"reconcile: {e}", file=sys.stderr)
        return 2
    except ReconcilerError as e:
        print(f"reconcile: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # an unreadable or unwritable file the user named or owns: exit 2, no traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"reconcile: {where}{e.strerror or e}", file=sys.stderr)
        return 2


def _dispatch(name: str, args: argparse.Namespace) -> int:
    if name == "validate":
        return cmd_validate(args)
    if name == "schema":
        return cmd_schema(args)
    from . import commands  # the loop's commands import more; validate stays light

    return commands.run(name, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
