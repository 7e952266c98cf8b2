"""Errors a user can fix: the CLI prints their message as one line, without a traceback."""


class UserError(Exception):
    """Bad input or a missing prerequisite; the message says what to do about it."""
