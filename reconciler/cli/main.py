# PYTHON_ARGCOMPLETE_OK
"""The command line, and nothing else: parse arguments, call the package, choose the exit code.

Exit codes: 0 success; 1 invalid specs, a failed check, or an action of a ``--once`` pass that
failed; 2 usage or I/O error, a run NAME that is not there included (like an unknown command, it is
a name the user typed). A user error is a message, never a traceback.

The global options (``--repo``, ``--config``, ``--json``, ``--log-format``) may stand before or
after the command, with the same meaning; each is accepted only by the commands it does
something for (``reconcile --json schema`` is refused). ``validate --json`` is ``validate --format
json``: one spelling for JSON across the commands. docs/cli.md is the reference, with the JSON shapes.

Shell completion is argcomplete's: ``reconcile completion bash`` prints the script, and the shell
then runs ``reconcile`` with ``_ARGCOMPLETE`` set for each TAB; ``main`` answers those before
anything else is imported (the marker on the first line lets argcomplete's global completion
find this module too).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reconciler.core.errors import ReconcilerError, UsageError

from .about import version

PROG = "reconcile"

COMMANDS = {
    "validate": "check specs, templates and fleets (exit 0 valid, 1 invalid, 2 usage or I/O error)",
    "schema": "write schemas/ from the models, or --check that they did not drift",
    "plan": "print what one pass would do, changing nothing (the same as --once --dry-run)",
    "status": "the runs' status, as a table or JSON",
    "logs": "a run's stdout and stderr, wherever it runs",
    "provenance": "what a run was made of, or --diff what differs from another run",
    "explain": "why a run is placed where it is, or why it waits: every machine and offer considered",
    "rentals": "this repository's rented machines: provider, run, state, price, cost; --reap gives back orphans "
               "and idle ones",
    "config": "the effective configuration as JSON, secrets redacted",
    "offers": "what the providers rent out now (live where they have a market): GPUs, region, price, spot",
    "init": "make a new repository of run specs: folders, a template, a Policy, schemas, editor settings and "
            "the pull-request workflows",
    "stop": "stop a run: commit desiredState: Stopped to its spec (or --patch: print the change)",
    "start": "start a stopped run again: commit desiredState: Running to its spec (or --patch)",
    "restart": "run it again from the beginning as a new generation: commit restartedAt to its spec (or --patch)",
    "ssh": "a shell (or -- COMMAND) in a run's workspace on its machine",
    "artifacts": "what a run has in its Storage: checkpoints, their manifests' checksums, artifacts; --get fetches",
    "reproduce": "write a new run spec pinned to what a run was made of (and --checkpoint N to start from)",
    "completion": "print the shell completion script: bash, zsh or fish",
    "agent": "on an in-house machine: hold its tunnel to the reconciler's host, drain or resume it; "
             "authorize prints what that host must allow",
}
SUBCOMMANDS = tuple(COMMANDS)
LOOP = ("plan", "status", "logs", "provenance", "config", "rentals", "explain")  # the commands that read the loop's configuration
SHELLS = ("bash", "zsh", "fish")

# Where each global option applies: command names, "once" (--once) and "daemon" (no command, no --once).
APPLIES: dict[str, tuple[str, ...]] = {
    "repo": ("validate", "schema", *LOOP, "agent", "stop", "start", "restart", "ssh", "once", "daemon"),
    "config": (*LOOP, "ssh", "once", "daemon"),
    "json": ("validate", *LOOP, "once"),
    "log_format": ("plan", "once", "daemon"),
    # the pass's and the daemon's own flags: before any command, never with one
    "dry_run": ("once",),
    "no_commit": ("once", "daemon"),
    "allow_dirty": ("once", "daemon"),
    "poll_interval": ("daemon",),
    "resync_interval": ("daemon",),
    "listen": ("daemon",),
}
# artifacts and reproduce read the loop's configuration (its state folder, the workspaces).
for _dest in ("repo", "config", "json"):
    APPLIES[_dest] += ("artifacts", "reproduce")
APPLIES.update({d: APPLIES[d] + ("offers",) for d in ("repo", "config", "json")})  # specs, state, secrets
FLAG = {dest: "--" + dest.replace("_", "-") for dest in APPLIES}
HINT = {("json", "daemon"): "use --log-format json for its log lines"}
DEFAULTS = {"repo": None, "config": None, "json": False, "log_format": None, "once": False, "dry_run": False,
            "no_commit": False, "allow_dirty": False, "poll_interval": None, "resync_interval": None, "listen": None}


class _Version(argparse.Action):
    """--version, read when asked (the metadata look-up costs time every other command would pay)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{PROG} {version()}")
        parser.exit()


def _repo_root(start: Path) -> Path:
    """The repository a path belongs to: the nearest ancestor with specs/, execution_templates/ or .git."""
    from reconciler.spec.load import is_spec_repo

    p = start.resolve()
    if p.is_file():
        p = p.parent
    for cand in (p, *p.parents):
        if is_spec_repo(cand) or (cand / ".git").exists():
            return cand
    return p


def cmd_validate(args: argparse.Namespace) -> int:
    from reconciler.core.diagnostics import render
    from reconciler.spec.load import is_spec_repo, load_tree, yaml_files

    fmt = _validate_format(args)
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
    out = render(desired.diagnostics, fmt, checked)
    if out:
        print(out)
    return 1 if desired.diagnostics else 0


def _validate_format(args: argparse.Namespace) -> str:
    """--json is --format json; with another --format the two disagree, and neither may win silently."""
    if args.json and args.format not in (None, "json"):
        raise UsageError(f"--json and --format {args.format} disagree; give one of them")
    return args.format or ("json" if args.json else "text")


def cmd_schema(args: argparse.Namespace) -> int:
    from reconciler.spec import schema

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


def cmd_completion(args: argparse.Namespace) -> int:
    import argcomplete

    # Registered for the name the user types; each TAB runs it with _ARGCOMPLETE set (see main).
    print(argcomplete.shellcode([PROG], shell=args.shell), end="")
    return 0


# ---------------------------------------------------------------- the parser


def _run_names(prefix: str, parsed_args: argparse.Namespace, **_) -> list[str]:
    """Completion of NAME: the runs that have a status file in the repository (--repo, or here)."""
    status = Path(getattr(parsed_args, "repo", None) or ".") / "status"
    try:
        return sorted(p.stem for p in status.glob("*.yaml") if p.stem.startswith(prefix))
    except OSError:
        return []


def _add_global(p: argparse.ArgumentParser, dest: str, help_text: str | None = None) -> None:
    """One global option, with no default: a value given before the command is not overwritten by
    the command's parser, and main() can tell which were given (DEFAULTS fills in the rest)."""
    kw: dict = {"default": argparse.SUPPRESS}
    if dest == "repo":
        p.add_argument("--repo", metavar="DIR", help=help_text or "the repository (default: the current directory)",
                       **kw)
    elif dest == "config":
        p.add_argument("--config", metavar="PATH",
                       help=help_text or "configuration file (default: reconciler.yaml in the repository, if present)",
                       **kw)
    elif dest == "json":
        p.add_argument("--json", action="store_true", help=help_text or "print JSON (docs/cli.md has the shape)",
                       **kw)
    elif dest == "log_format":
        p.add_argument("--log-format", choices=["text", "json"],
                       help=help_text or "format of the log lines on stderr (default: log_format in the configuration)",
                       **kw)
    else:  # pragma: no cover - a table entry without an option
        raise AssertionError(dest)


def _add_command_globals(p: argparse.ArgumentParser, name: str, **helps: str) -> None:
    for dest in ("repo", "config", "json", "log_format"):
        if name in APPLIES[dest]:
            _add_global(p, dest, helps.get(dest))


def _applies_text(dest: str) -> str:
    names = [n for n in APPLIES[dest] if n in COMMANDS]
    extra = [w for w, n in (("--once", "once"), ("the daemon", "daemon")) if n in APPLIES[dest]]
    return "; for " + ", ".join(names + extra)


def build_parser(commands: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``commands``: only these commands get their arguments (``main`` adds the
    one it runs: each command's options import its module, and a pass needs none of them)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s [OPTIONS]                    the daemon; with --once, one pass\n"
              "       %(prog)s [OPTIONS] COMMAND [ARGS]  a command; global OPTIONS before or after it",
        description="Make the machines match the run specs in a git repository, and commit what happened. "
                    "Without a command: the daemon (watch, resync, pull and push); --once: one pass.",
        epilog="Global options may stand before or after the command. Exit codes: 0 ok, 1 invalid specs or a "
               "failed action or check, 2 usage or I/O error. Reference: docs/cli.md.",
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    for dest in ("repo", "config", "json", "log_format"):
        _add_global(p, dest, {"repo": "the repository (default: the current directory)",
                              "config": "configuration file (default: reconciler.yaml in the repository)"
                                        + _applies_text("config"),
                              "json": "print JSON" + _applies_text("json"),
                              "log_format": "log lines on stderr as text or JSON" + _applies_text("log_format"),
                              }[dest])
    s = argparse.SUPPRESS
    p.add_argument("--once", action="store_true", default=s, help="run one pass and exit (exit 1 if an action failed)")
    p.add_argument("--dry-run", action="store_true", default=s, help="with --once: print the plan, change nothing")
    p.add_argument("--no-commit", action="store_true", default=s, help="write status files but do not commit them")
    p.add_argument("--allow-dirty", action="store_true", default=s, help="launch spec files with uncommitted changes "
                   "(recorded as spec.dirty in the status); without it such a run waits until they are committed")
    p.add_argument("--poll-interval", type=float, default=s, metavar="SECONDS", help="daemon: between git fetches")
    p.add_argument("--resync-interval", type=float, default=s, metavar="SECONDS", help="daemon: between full passes")
    p.add_argument("--listen", default=s, metavar="HOST:PORT", help="daemon: for /healthz, /metrics and /hooks/git")

    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    p.commands = {}  # name → its parser, for its usage line in errors
    for name, text in COMMANDS.items():
        c = sub.add_parser(name, prog=f"{PROG} {name}", help=text, description=text[0].upper() + text[1:] + ".")
        if commands is None or name in commands:
            _build_command(c, name)
        p.commands[name] = c
    return p


def _build_command(p: argparse.ArgumentParser, name: str) -> None:
    if name == "validate":
        p.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: the whole repository)")
        # No default (text is the default): a --format given must be told apart from --json alone.
        p.add_argument("--format", choices=["text", "json", "github"], default=None)
        _add_command_globals(p, name, repo="repository root (default: found from the paths or the current directory)",
                             json="the result as JSON (the same as --format json)")
    elif name == "schema":
        p.add_argument("--check", action="store_true", help="exit 1 if schemas/ differs from the models")
        _add_command_globals(p, name)
    elif name == "plan":
        p.add_argument("--offline", action="store_true", help="from the specs and the committed status files "
                       "alone: no SSH, no secrets (safe for pull requests, forks included)")
        p.add_argument("--detailed-exitcode", action="store_true", help="exit 0 without changes, 2 with changes, "
                       "1 on invalid specs or an error")
        p.add_argument("--github", action="store_true", help="with --offline, in a pull request's workflow: the plan "
                       "as markdown in the job summary, and one pull request comment kept up to date")
        _add_command_globals(p, name)
    elif name == "status":
        p.add_argument("name", nargs="?", metavar="NAME", help="one run (default: all)").completer = _run_names
        p.add_argument("--machines", action="store_true", help="the fleet's machines instead (asks each one): "
                       "attached, draining, drained or unreachable")
        p.add_argument("-o", "--output", choices=["table", "yaml", "json"], default=None,
                       help="table (default), the status files as yaml, or json (the same as --json)")
        _add_command_globals(p, name)
    elif name == "agent":
        _build_agent(p)
    elif name == "logs":
        p.add_argument("name", metavar="NAME").completer = _run_names
        p.add_argument("--follow", "-f", action="store_true", help="poll until the run has finished")
        p.add_argument("--stream", choices=["stdout", "stderr", "both"], default="both")
        p.add_argument("--lines", "-n", type=int, default=100, metavar="N",
                       help="start with the last N lines of each file (default 100; 0: all)")
        p.add_argument("--raw", action="store_true",
                       help="write the bytes as the job wrote them, escape sequences included; without it a "
                       "terminal shows control characters other than newline and tab escaped (\\x1b), while "
                       "a pipe or a file always gets the exact bytes")
        p.add_argument("--timestamps", "-t", action="store_true", help="put the time each line was written "
                       "(UTC) before it (both streams: from the run's log index)")
        _add_command_globals(p, name, json="one JSON object per line: {\"stream\", \"line\"}")
    elif name == "provenance":
        name_arg = p.add_argument("name", metavar="NAME", help="a run, or one attempt's identity (NAME-gG-aA)")
        name_arg.completer = _run_names
        p.add_argument("--diff", metavar="OTHER", help="compare with another run or identity (exit 1 if they differ)")
        _add_command_globals(p, name, json="--diff as JSON (the manifest is JSON either way)")
    elif name == "explain":
        p.add_argument("name", metavar="NAME", help="a run").completer = _run_names
        _add_command_globals(p, name)
    elif name == "rentals":
        p.add_argument("--reap", action="store_true", help="give back what a pass would: orphans past their grace, "
                       "idle rentals past idle, failed ones")
        p.add_argument("--dry-run", dest="reap_dry_run", action="store_true",
                       help="with --reap: print what would be given back, change nothing")
        _add_command_globals(p, name)
    elif name == "config":
        _add_command_globals(p, name, json="the same JSON document (the output is JSON either way)")
    elif name == "offers":
        _build_offers(p)
    elif name in ("stop", "start", "restart"):
        from .steer import build as build_steer

        build_steer(p, _run_names)
        _add_command_globals(p, name)
    elif name == "ssh":
        from .shell import build as build_ssh

        build_ssh(p, _run_names)
        _add_command_globals(p, name)
    elif name == "init":
        from .scaffold import build as build_init

        build_init(p)
    elif name in ("artifacts", "reproduce"):
        from .storage_args import build as build_outputs

        build_outputs(p, name, _run_names, _add_command_globals)
    elif name == "completion":
        p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="one of: " + ", ".join(SHELLS))
        p.epilog = ('Install: eval "$(reconcile completion bash)" in ~/.bashrc (zsh: the same line in ~/.zshrc, after '
                    "compinit); fish: reconcile completion fish > ~/.config/fish/completions/reconcile.fish")


def _build_offers(p: argparse.ArgumentParser) -> None:
    from .offers import build

    build(p, _add_command_globals)


def _build_agent(p: argparse.ArgumentParser) -> None:
    from .agent import build_parser

    build_parser(p, PROG, _add_command_globals)


# ---------------------------------------------------------------- typos, misplaced options


def _takes_value(p: argparse.ArgumentParser) -> dict[str, bool]:
    return {opt: a.nargs != 0 for a in p._actions for opt in a.option_strings}


def _command_word(argv: list[str], options: dict[str, bool]) -> str | None:
    """The first word that is not an option or an option's value: the command, if any."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("-") and a != "-":
            opt = a.split("=", 1)[0]
            known = [o for o in options if o == opt] or [o for o in options if o.startswith("--") and o.startswith(opt)]
            if "=" not in a and len(known) == 1 and options[known[0]]:
                i += 1  # its value
            i += 1
            continue
        return a
    return None


def _unknown_command(word: str) -> str:
    from difflib import get_close_matches

    close = get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.6)
    if close:
        return f"unknown command {word!r}; did you mean {close[0]!r}?"
    return f"unknown command {word!r} (commands: {', '.join(SUBCOMMANDS)}; see reconcile --help)"


def _where(cmd: str) -> str:
    return {"once": "--once", "daemon": "the daemon"}.get(cmd, repr(cmd))


def _check_applies(ns: argparse.Namespace, cmd: str) -> None:
    for dest, where in APPLIES.items():
        if hasattr(ns, dest) and cmd not in where:
            if dest == "dry_run" and cmd == "daemon":
                raise UsageError("--dry-run needs --once (or use 'reconcile plan')")
            hint = HINT.get((dest, cmd))
            raise UsageError(f"{FLAG[dest]} does not apply to {_where(cmd)}" + (f" ({hint})" if hint else ""))


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None) -> tuple[str, argparse.Namespace]:
    """argv → (what to run: a command, "once" or "daemon"; its arguments, every global one set).
    Raises UsageError, or SystemExit from argparse (its usage message, --help, --version)."""
    p = parser or build_parser()
    word = _command_word(argv, _takes_value(p))
    if word is not None and word not in COMMANDS:
        raise UsageError(_unknown_command(word))
    remote: list[str] = []
    if word == "ssh" and "--" in argv:  # what follows is the remote command's, options included
        cut = argv.index("--")
        argv, remote = argv[:cut], argv[cut + 1:]
    ns, extra = p.parse_known_args(argv)
    if extra:
        if ns.command:  # the command's own usage line, and a hint where there is one
            hint = next((f" ({h})" for (d, c), h in HINT.items() if c == ns.command and FLAG[d] in extra), "")
            p.commands[ns.command].error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if ns.command and getattr(ns, "once", False):
        raise UsageError(f"--once runs one pass and takes no command ({ns.command!r} is one)")
    cmd = ns.command or ("once" if getattr(ns, "once", False) else "daemon")
    _check_applies(ns, cmd)
    for k, v in DEFAULTS.items():
        if not hasattr(ns, k):
            setattr(ns, k, v)
    if ns.command == "ssh":
        ns.remote = remote
    if ns.command == "logs" and ns.lines < 0:
        raise UsageError("--lines must be 0 (all) or more")
    return cmd, ns


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "_ARGCOMPLETE" in os.environ:  # a TAB in a shell that loaded `reconcile completion SHELL`
            import argcomplete

            argcomplete.autocomplete(build_parser())  # prints the candidates to the shell and exits
        parser = build_parser(commands=())
        word = _command_word(argv, _takes_value(parser))
        if word in COMMANDS:
            _build_command(parser.commands[word], word)
        cmd, args = parse(argv, parser)
        return _dispatch(cmd, args)
    except SystemExit as e:  # argparse: usage errors (2), --help and --version (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
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
    if name == "completion":
        return cmd_completion(args)
    if name == "init":
        from .scaffold import cmd_init

        return cmd_init(args)
    if name == "agent":
        from .agent import cmd_agent

        return cmd_agent(args)
    from . import commands  # the loop's commands import more; validate stays light
    from reconciler.core.procenv import seal_own_environment

    # Every command past this point holds secrets in its environment and starts processes that
    # run as the same user (local runs): they must not read this one's /proc/<pid>/environ.
    seal_own_environment()

    if name in ("artifacts", "reproduce"):
        from .storage_args import dispatch

        return dispatch(name, args)
    if name == "offers":
        from .offers import cmd_offers

        return cmd_offers(args)

    return commands.run(name, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
