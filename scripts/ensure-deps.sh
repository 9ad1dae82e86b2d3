#!/usr/bin/env bash
# What `make run` needs besides the venv: Fashion-MNIST where the runners look
# ($ZOBENCH_DATA/fashion-mnist, then /usr/share/datasets/fashion-mnist) and the tools
# that build the C++ runner (cmake, g++, nlohmann-json). Installed with apt where it is
# usable; otherwise this says what to install.
set -euo pipefail
have_data() { ls "$1"/train-images-idx3-ubyte* >/dev/null 2>&1; }
need=()
if ! { { [ -n "${ZOBENCH_DATA:-}" ] && have_data "$ZOBENCH_DATA/fashion-mnist"; } || have_data /usr/share/datasets/fashion-mnist; }; then
  need+=(dataset-fashion-mnist)
fi
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  echo "installing ${need[*]} ..." >&2
  if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 ||
     { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; }; then
    exit 0
  fi
fi
cat >&2 <<MSG
Missing: ${need[*]}. On Debian/Ubuntu: sudo apt-get install ${need[*]}
Without apt: install cmake, g++ and nlohmann-json, and put the four Fashion-MNIST IDX files
(train-images-idx3-ubyte.gz, ...) in DIR/fashion-mnist with ZOBENCH_DATA=DIR exported.
MSG
exit 1
