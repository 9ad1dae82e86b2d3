#!/usr/bin/env bash
# Make sure Fashion-MNIST is where the runners look ($ZOBENCH_DATA/fashion-mnist,
# then /usr/share/datasets/fashion-mnist): install Debian's package where apt is
# usable, otherwise say how to get the IDX files.
set -euo pipefail
have() { ls "$1"/train-images-idx3-ubyte* >/dev/null 2>&1; }
if { [ -n "${ZOBENCH_DATA:-}" ] && have "$ZOBENCH_DATA/fashion-mnist"; } || have /usr/share/datasets/fashion-mnist; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  echo "installing Debian's dataset-fashion-mnist package ..." >&2
  if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 ||
     { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; }; then
    exit 0
  fi
fi
cat >&2 <<MSG
Fashion-MNIST not found. Either
  - on Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist   (installs /usr/share/datasets/fashion-mnist), or
  - put train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
    t10k-labels-idx1-ubyte.gz in a folder DIR/fashion-mnist and export ZOBENCH_DATA=DIR
MSG
exit 1
