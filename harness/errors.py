"""Errors the CLI turns into one clear line instead of a traceback."""


class UserError(Exception):
    """Bad input from the user: what was wrong, where, and what would be valid."""
