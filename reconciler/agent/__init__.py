"""The in-house machine's side: an outbound OpenSSH tunnel to the reconciler's host, kept up, so a
machine that accepts no inbound connection is reached like any other."""
