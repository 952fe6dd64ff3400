#!/usr/bin/env bash
# Per-kernel GPU time of one eager forward pass of the 8B-shaped model (Nsight Compute, clocks
# left alone), summed by kernel: where a decode step's time goes beyond the weight GEMVs
# (MODE=decode, the default), or an 8192-token prefill's beyond the GEMMs (MODE=prefill).
# Run on the device from the repository root with the unpacked bundle: MODEL_BIN=... OUT=...
set -euo pipefail
MODEL_BIN=${MODEL_BIN:?path to lragent_model_bench}
OUT=${OUT:-.}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
# --steps 1: the decode loop runs 3 steps (2 warm-up + 1) per scenario; profile everything after
# the weights and the 4k prefill, then keep the kernels of the last base-model step.
if [ "${MODE:-decode}" = prefill ]; then
  ARGS=(--prefill 8192 --ctx 64 --steps 1 --reps 0 --eager)
  SKIP=${SKIP:-200} COUNT=${COUNT:-1400}
else
  ARGS=(--prefill 0 --ctx 4096 --steps 1 --reps 1 --eager)
fi
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --launch-skip "${SKIP:-1000}" --launch-count "${COUNT:-2400}" \
  "$MODEL_BIN" "${ARGS[@]}" >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || true
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    unit = r.get("Metric Unit", "nsecond")
    v = float(r["Metric Value"].replace(",", ""))
    v = v / 1000 if unit in ("nsecond", "ns") else (v * 1000 if unit in ("msecond", "ms") else v)
    rows.append((int(r["ID"]), r["Kernel Name"][:70], v))
rows.sort()
print(f"{len(rows)} kernels profiled")
# A decode step: from one embedding kernel to the next.
starts = [i for i, (_, n, _) in enumerate(rows) if "embedding" in n]
print("embedding kernels at", starts[:12])
if len(starts) >= 2:
    for a, b in zip(starts, starts[1:]):
        if b - a < 5000 and b - a > 100:
            step = rows[a:b]
            break
    else:
        step = rows[starts[-2]:starts[-1]]
    tot = collections.defaultdict(lambda: [0, 0.0])
    for _, n, v in step:
        tot[n][0] += 1
        tot[n][1] += v
    s = sum(v for _, _, v in step)
    print(f"one forward pass: {len(step)} kernels, {s:.1f} us of kernel time")
    for n, (c, v) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print(f"  {v:9.1f} us {100*v/s:5.1f}%  {c:4d}x  {v/c:7.2f} us  {n}")
PY
