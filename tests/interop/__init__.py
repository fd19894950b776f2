"""Go programs built on the reference libcni, and the helper that builds them for tests."""
