"""Values every layer shares: errors that say whether to retry, run identities, machine names, the
observed world, a run's status as a value, the trust boundary's parsers, the configuration, YAML in
and out. Nothing here imports another room or reaches a machine; the one process it starts is git,
asked for the checkout's branch and remote when the configuration loads."""
