#!/usr/bin/env bash
# `ensure-deps.sh run|test|bench`: what `make run` / `make test` / `make bench` need besides the venv. The list, and
# how each tool is found, is testkit/tools.py. The missing tools' packages are installed with
# apt where it is usable (on PATH, as root or with passwordless sudo). Otherwise one
# message names what is missing: `make run` stops, `make test` goes on and the tests that need
# a missing tool are skipped with its name.
set -euo pipefail
level=${1:?usage: ensure-deps.sh run|test|bench}
cd "$(dirname "$0")/.."
tools() { "${PYTHON:-python3}" testkit/tools.py "$@"; }

mapfile -t need < <(tools packages "$level")
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
  if [ ${#sudo[@]} -eq 0 ] || sudo -n true 2>/dev/null; then
    echo "zobench: installing ${need[*]} ..." >&2
    apt_install() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
    # the package lists are refreshed only when the install cannot find a package in them
    apt_install 2>/dev/null || { "${sudo[@]}" apt-get update -qq && apt_install; } || true
  fi
fi
tools check "$level"
