#!/usr/bin/env bash
# The LRAgent trace benchmark on the GPU machine, one model per call (issue: reproduce the
# poster's tables): lragent bench trace (all modes x the 7 poster lengths, agents curve), the same
# with a KV budget (what running out looks like), the HF transformers + PEFT peer on the very same
# traces, then bench/trace/report.py -> bench/results/trace-<preset>-<gpu>-<date>.{json,md,png}.
#   PRESET=llama3.1-8b bash scripts/trace-bench.sh        (after scripts/device-bundle.sh here)
# Env: PRESET, LENGTHS (default: the poster's), KV_BUDGET_GB (default 6), PEER_ATTN (eager,sdpa),
#      PEER_EAGER_MAX (longest length eager runs; default 9100), OUT (a tarball of the results),
#      STAGES (default ours,budget,peer,cached,report: a call that would overrun the device's
#      10-minute limit can run `ours`, then `budget,peer`, then `cached,report`; the work folder
#      build-trace-PRESET stays on a warm machine, else put its JSON files back into it first:
#      a call without `report` copies them to OUT when it is set),
#      WARMUP_RUNS (untimed runs of every cell before it is timed, ours and the peer's; default 1).
#      `cached` is the HF SDPA peer keeping one DynamicCache per agent (hf-sdpa-cached).
set -u
set -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PRESET=${PRESET:-llama3.1-8b}
LENGTHS=${LENGTHS:-1900,3000,5000,9100,17300,33700,66400}
KV_BUDGET_GB=${KV_BUDGET_GB:-6}
PEER_EAGER_MAX=${PEER_EAGER_MAX:-9100}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 ))s; }
if [ -f .devbundle/bundle.tar.xz ]; then
  LB=/tmp/lragent-bundle
  [ -x $LB/bin/lragent ] || { rm -rf $LB && mkdir -p $LB && tar -C $LB -xJf .devbundle/bundle.tar.xz; }
  export LD_LIBRARY_PATH="$LB/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  BIN=$LB/bin/lragent
else
  BIN=${BIN:-build-cuda/lragent}
fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
SLUG=$(echo "${GPU:-gpu}" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
DATE=$(date -u +%Y%m%d)
# LRAGENT_COMMIT, else the bundle's commit (device-bundle.sh), else this copy's .git (which on the
# GPU machine can be a stale one).
BUNDLE_COMMIT=$( [ -n "${LB:-}" ] && cat "$LB/COMMIT" 2>/dev/null )
COMMIT=${LRAGENT_COMMIT:-${BUNDLE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}}
W=build-trace-$PRESET
STAGES=${STAGES:-ours,budget,peer,cached,report}
WARMUP_RUNS=${WARMUP_RUNS:-1}
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
# A stage whose command fails (an engine error, a timeout) is named at the end and makes the
# script exit non-zero, so that a broken run cannot pass for a finished one.
# checked NAME, right after a stage's pipeline: its first command's exit status.
FAILED=()
checked() {
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && return
  FAILED+=("$1 (exit $rc)")
  echo "== FAILED: $1 (exit $rc)"
}
stage ours && rm -rf "$W"
mkdir -p "$W" bench/results
PREFIX=bench/results/trace-$PRESET-$SLUG-$DATE
echo "== trace bench $PRESET on $GPU, commit $COMMIT"

if stage ours; then
echo "== ours ($(elapsed))"
timeout ${OURS_TIMEOUT:-400} "$BIN" bench trace --device cuda --preset "$PRESET" --lengths "$LENGTHS" --agents-curve \
  --warmup-runs "$WARMUP_RUNS" --json "$W/ours.json" --markdown "$W/ours.md" --dump-traces "$W/traces.json" 2>&1 | tee "$W/ours.log" | grep -vE "^\[#"
checked ours
fi
if stage budget; then
echo "== ours with --kv-budget $KV_BUDGET_GB GB ($(elapsed))"
timeout ${BUDGET_TIMEOUT:-250} "$BIN" bench trace --device cuda --preset "$PRESET" --lengths "$LENGTHS" --kv-budget "$KV_BUDGET_GB" \
  --warmup-runs "$WARMUP_RUNS" \
  --json "$W/ours-budget.json" 2>&1 | tee "$W/budget.log" | grep -vE "^\[#" | tail -12
checked budget
fi
if stage peer; then
echo "== HF transformers + PEFT peer ($(elapsed))"
SHORT=$(python3 -c "import sys; print(','.join(x for x in sys.argv[1].split(',') if int(x) <= int(sys.argv[2])))" \
  "$LENGTHS" "$PEER_EAGER_MAX")
PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-400} python3 bench/trace/hf_peer.py --traces "$W/traces.json" --out "$W/peer-sdpa.json" \
  --attn sdpa --skip-after-oom --warmup-runs "$WARMUP_RUNS" 2>&1 | tee "$W/peer.log" | tail -12
checked peer-sdpa
if [ -n "$SHORT" ]; then
  PYTHONUNBUFFERED=1 timeout ${PEER_EAGER_TIMEOUT:-150} python3 bench/trace/hf_peer.py --traces "$W/traces.json" --out "$W/peer-eager.json" \
    --attn eager --lengths "$SHORT" --skip-after-oom --warmup-runs "$WARMUP_RUNS" 2>&1 | tee -a "$W/peer.log" | tail -8
  checked peer-eager
fi
fi
if stage cached; then
echo "== HF peer with one cache per agent ($(elapsed))"
PYTHONUNBUFFERED=1 timeout ${PEER_CACHED_TIMEOUT:-300} python3 bench/trace/hf_peer.py --traces "$W/traces.json" \
  --out "$W/peer-sdpa-cached.json" --attn sdpa --cache-per-agent --skip-after-oom --warmup-runs "$WARMUP_RUNS" 2>&1 \
  | tee -a "$W/peer.log" | tail -8
checked peer-sdpa-cached
fi
if stage peer || stage cached; then
python3 - "$W" <<'PY'
import json, sys, os
w = sys.argv[1]
out = None
for name in ("peer-sdpa.json", "peer-eager.json", "peer-sdpa-cached.json"):
    p = os.path.join(w, name)
    if not os.path.exists(p):
        continue
    d = json.load(open(p))
    if out is None:
        out = d
    else:
        for k, v in d.items():
            if isinstance(v, list) and isinstance(out.get(k), list):
                out[k] += v
json.dump(out or {}, open(os.path.join(w, "peer.json"), "w"), indent=1)
PY
fi
done_stages() {
  if [ ${#FAILED[@]} -gt 0 ]; then
    echo "== stages $STAGES ended in $(elapsed) with failures: ${FAILED[*]} (logs in $W)"
    exit 1
  fi
  echo "== $1 in $(elapsed)"
  exit 0
}
if ! stage report; then
  # A call without the report: its JSON files go to $OUT too, so that a machine that goes cold
  # before the next call loses nothing (put them back into $W there).
  if [ -n "${OUT:-}" ]; then cp "$W"/*.json "$OUT"/ 2>/dev/null; fi
  done_stages "stages $STAGES done"
fi

echo "== report ($(elapsed))"
python3 bench/trace/report.py --ours "$W/ours.json" --ours-budget "$W/ours-budget.json" --peer "$W/peer.json" \
  --out "$PREFIX" --commit "$COMMIT" 2>&1 | tail -5
checked report
cp "$W/ours.json" "$PREFIX.json"
[ -f "$W/peer.json" ] && cp "$W/peer.json" "$PREFIX-peer.json"
[ -f "$W/ours-budget.json" ] && cp "$W/ours-budget.json" "$PREFIX-budget.json"
cat "$PREFIX.md" 2>/dev/null | head -60
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/trace-$PRESET.tgz" "$PREFIX"* "$W"/*.log
fi
done_stages "trace bench done"
