"""Real-part test infrastructure: an sshd and a docker daemon the tests start on loopback."""
