"""User errors: reported as one line on stderr with exit code 2, never a traceback."""


class UserError(Exception):
    """Bad usage or configuration; the message names the file, key and what was expected."""


def one_line(text: str) -> str:
    """A message as the one line an error is: its lines joined by '; '. A library's message may
    span several (urllib's redirect loop: three), and an error quotes it whole."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
