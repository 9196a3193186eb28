"""Rental providers: one module per provider, behind the small interface in ``base.py``.

Nothing outside this package knows a provider's API. ``adapter_for`` picks the module by the
Provider's ``type``; adding a provider is one module here plus its name in ``ADAPTERS``.
"""

from __future__ import annotations

from .base import Adapter, AdapterContext, Rental, adapter_for

__all__ = ["Adapter", "AdapterContext", "Rental", "adapter_for"]
