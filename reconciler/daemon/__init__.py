"""The long-running service: passes on a thread, the git watch and resync, health, metrics, the
live page, systemd readiness, and the one-writer lock of a checkout."""
