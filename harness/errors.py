"""User errors: reported as one line on stderr with exit code 2, never a traceback."""


class UserError(Exception):
    """Bad usage or configuration; the message names the file, key and what was expected."""


def one_line(text: str) -> str:
    """A message as the one line an error is: its lines joined by '; '. A library's message may
    span several (urllib's redirect loop: three), and an error quotes it whole."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM) stopped a command where nothing of it is kept (a data set's
    fetch, harness/wheel_data.py): the error boundary prints its one line, `PROG: <message>`,
    and exits 128 + the signal, as `zobench run` does when a signal stops it."""

    def __init__(self, signum: int, message: str):
        super().__init__(one_line(message))
        self.signum = signum
