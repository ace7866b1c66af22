"""Images run and judged: the one server harness, the smoke checks, traffic for load and stop
tests, the `run` line, and reading what an image holds."""
