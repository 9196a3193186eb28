"""The status files: writing and reading ``status/<run>.yaml`` byte-stably, summarizing a change
and its outcome into the next status, the ledger beside them, and the world as they last recorded it
(what ``plan --offline`` plans on)."""
