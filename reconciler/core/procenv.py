"""The environment of every process the reconciler starts: built from an allowlist, never inherited.

The reconciler host holds the control plane's secrets in its own environment: provider API keys,
the webhook secret, every secret any run may be granted, other teams' tokens. A child started with
``dict(os.environ)`` receives all of them, and so does whatever that child starts in turn (a local
run, a provider's executable, a git hook, a Slurm job whose environment slurmctld saves to disk).
So no child gets the environment wholesale: it gets a small base that programs need to work (where
to find programs, the home folder, the locale, the time zone, the temporary folder, who it runs as),
plus what its caller names explicitly (a provider's own credential, git's own settings, a run's
declared variables). Anything else stays in this process.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

# What any program needs to run as a well-behaved process of this user; none of these is a secret.
BASE = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Git's own settings, when the operator set them for the reconciler (the deploy key's ssh command,
# a global config, CA bundles): the reconciler's git needs them to reach its remote.
GIT_PREFIX = "GIT_"
# Proxies: the reconciler's own way out to its git remote and providers' APIs.
PROXIES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


def base(extra: Mapping[str, str] | None = None, keep: Iterable[str] = (),
         environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The base variables (those set here), the names in ``keep`` taken from this process when
    set, then ``extra`` as given (it wins)."""
    src = os.environ if environ is None else environ
    env = {k: src[k] for k in (*BASE, *keep) if k in src}
    env.setdefault("PATH", DEFAULT_PATH)
    if extra:
        env.update(extra)
    return env


def for_git(extra: Mapping[str, str] | None = None, ssh_agent: bool = True,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """For the reconciler's own git: the base, git's own GIT_* settings and the proxies, and the
    ssh agent's socket (``ssh_agent``) where git reaches a remote over ssh with the operator's key."""
    src = os.environ if environ is None else environ
    # GNUPGHOME: where the signing program finds its keys, where commits are signed.
    keep = [k for k in src if k.startswith(GIT_PREFIX)] + list(PROXIES) + ["GNUPGHOME"]
    if ssh_agent:
        keep.append("SSH_AUTH_SOCK")
    return base(extra, keep=keep, environ=src)


PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4  # <linux/prctl.h>


def seal_own_environment() -> bool:
    """Make this process non-dumpable, so that processes of the same unix user cannot read its
    ``/proc/<pid>/environ`` or memory (proc(5): such files become owned by root). Local runs run
    as the reconciler's own user; without this a job could read every secret of the daemon
    directly, whatever the environment it was started with. The cost: no core dump of the
    reconciler, and a debugger or profiler must attach as root. Returns whether it took effect
    (False off Linux, where there is no such /proc to protect)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return False
        return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
