"""One module per command (asv's commands/ is the model): each adds its parser (`add`) and
runs it (`main`, the exit code); the work itself lives in the library. COMMANDS is their order
in `zobench --help`."""
from . import build, compare, export, fit, history, memory, publish, pull, push, report, results, run, targets, tune

COMMANDS = (run, push, history, pull, publish, results, report, build, compare, export, memory, fit, tune, targets)
