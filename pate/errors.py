"""Errors a user can fix: the CLI prints their message as one line, without a traceback."""


class UserError(Exception):
    """Bad input or a missing prerequisite; the message says what to do about it. Whitespace runs,
    newlines included (a wrapped library error, say), fold to single spaces: one line always."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
