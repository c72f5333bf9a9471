"""Errors of the process layer (set-up, configuration). Domain errors live in streams.domain."""


class SetupError(RuntimeError):
    """Something the operator must fix: a missing tool, a busy port, a corrupt data dir."""
