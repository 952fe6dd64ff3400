#!/usr/bin/env bash
# A/B of the 8B decode step between variants, interleaved round by round (a GPU's speed drifts
# between runs; interleaving spreads the drift over every variant). Each variant is
# "label|ENV=VAL ...|binary" (binary: a lragent_model_bench; ENV may be empty). Prints the
# median ms/step of each run and, per variant, the median over the rounds.
#   ROUNDS=4 bash bench/cuda/ab_decode.sh "off|LRAGENT_CUDA_FUSE=0|$B" "on||$B"
# KEYS picks the figures (space-separated): decode (default), decode_lora_base_lr, decode_lora_full.
set -euo pipefail
ROUNDS=${ROUNDS:-4}
CTX=${CTX:-4096}
TMP=$(mktemp -d)
for ((i = 1; i <= ROUNDS; ++i)); do
  for v in "$@"; do
    IFS='|' read -r label envs bin <<<"$v"
    # shellcheck disable=SC2086
    env $envs "$bin" --preset "${PRESET:-llama3.1-8b}" --ctx "$CTX" --prefill 0 --out "$TMP/r.json" >/dev/null 2>&1
    for key in ${KEYS:-decode}; do
      ms=$(python3 -c "import json; print(json.load(open('$TMP/r.json'))['$key']['median_ms'])")
      echo "$label/$key $ms" | tee -a "$TMP/all.txt"
    done
  done
done
python3 - "$TMP/all.txt" <<'PY'
import sys, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    runs[k].append(float(v))
for k, v in runs.items():
    print(f"{k:>28}: median {statistics.median(v):.3f} ms/step over {len(v)} runs (min {min(v):.3f}, max {max(v):.3f})")
PY
rm -rf "$TMP"
