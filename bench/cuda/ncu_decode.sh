#!/usr/bin/env bash
# Per-kernel GPU time of one eager forward pass of the 8B-shaped model (Nsight Compute, clocks
# left alone), summed by kernel: where a decode step's time goes beyond the weight GEMVs
# (MODE=decode, the default), or an 8192-token prefill's beyond the GEMMs (MODE=prefill), or
# (MODE=lora, CTX=32768 by default) the plain, base-lr and private full LoRA decode steps at one
# context side by side: what the LoRA cache modes add per kernel.
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
elif [ "${MODE:-decode}" = lora ]; then
  # Every kernel: the passes are told apart by their embedding kernels (see below).
  ARGS=(--prefill 0 --ctx "${CTX:-32768}" --steps 1 --reps 0 --eager)
  SKIP=${SKIP:-0} COUNT=${COUNT:-20000}
else
  ARGS=(--prefill 0 --ctx 4096 --steps 1 --reps 1 --eager)
fi
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --launch-skip "${SKIP:-1000}" --launch-count "${COUNT:-2400}" \
  "$MODEL_BIN" "${ARGS[@]}" >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || true
python3 - "$OUT/ncu.csv" "${MODE:-decode}" <<'PY'
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
if sys.argv[2] == "lora":
    # Passes, in model_bench's order: the base prefill, 9 base decode steps (greedy, sampled,
    # lookahead; the lookahead adds one), then for base-lr and private full each a prefill and
    # 3 decode steps. A pass runs from one embedding kernel to the next.
    starts = [i for i, (_, n, _) in enumerate(rows) if "embedding" in n] + [len(rows)]
    passes = [rows[a:b] for a, b in zip(starts, starts[1:])]
    for i, p in enumerate(passes):
        print(f"pass {i}: {len(p)} kernels, {sum(v for _, _, v in p):.1f} us")
    if len(passes) < 9:
        sys.exit("fewer passes than expected: is the embedding kernel still called so?")
    pick = {"plain": passes[2], "base-lr": passes[-5], "full": passes[-1]}
    tot = {k: collections.defaultdict(lambda: [0, 0.0]) for k in pick}
    for k, p in pick.items():
        for _, n, v in p:
            tot[k][n][0] += 1
            tot[k][n][1] += v
    names = sorted(set().union(*[t.keys() for t in tot.values()]),
                   key=lambda n: -max(t[n][1] for t in tot.values()))
    print("  " + "  ".join(f"{k:>16}" for k in pick) + "  kernel (us, count)")
    print("  " + "  ".join(f"{sum(v for _, _, v in p):16.1f}" for p in pick.values()) + "  all")
    for n in names:
        print("  " + "  ".join(f"{tot[k][n][1]:10.1f} {tot[k][n][0]:5d}" for k in pick) + f"  {n}")
    sys.exit(0)
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
