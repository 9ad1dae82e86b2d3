"""Where the checkout's data lives (profiles, suites) and where results go by default."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS_DIR = REPO / "targets"
SUITES_DIR = REPO / "workloads" / "suites"


def user_inventory() -> Path:
    return Path("~/.config/zobench/targets.toml").expanduser()


def user_config() -> Path:
    """The user's settings beside the inventory: a [store] table (harness/stores/pgstore.py)."""
    return Path("~/.config/zobench/config.toml").expanduser()

DEFAULT_RESULTS = Path("results")
