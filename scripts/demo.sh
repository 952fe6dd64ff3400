#!/usr/bin/env bash
# The main job (README): installs dependencies, builds, and runs lragent on the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "${JOBS:-$(nproc)}"
exec ./build/lragent demo "$@"
