"""The installed reconciler's version, for ``--version`` and what ``reconcile init`` pins."""

from __future__ import annotations

DIST = "gpu-reconciler"  # the distribution's name


def version() -> str:
    """The installed distribution's version; a source tree run without installing reports the package's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DIST)
    except PackageNotFoundError:
        from reconciler import __version__

        return __version__
