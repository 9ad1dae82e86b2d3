"""User errors: reported as one line on stderr with exit code 2, never a traceback."""


class UserError(Exception):
    """Bad usage or configuration; the message names the file, key and what was expected."""
