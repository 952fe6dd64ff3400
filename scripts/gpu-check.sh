#!/usr/bin/env bash
# One-shot GPU check, run on the device machine from the repository root:
#   build (CUDA, Release, sm_90a) -> CUDA tests -> SASS/resource summary -> attention bench
#   -> whole-model bench (8B shapes) -> `lragent replay --device cuda` on tinystories
#   -> `lragent serve` CPU vs CUDA and the trace over HTTP (bench/results/serve-<gpu>-...)
#   -> PyTorch SDPA peer -> bench/results/kernels-<gpu>-<date>.{json,md,png} (and, under $OUT,
#      reports.tar.gz of every report and logs.tar.gz: the device tool brings back 8 files at most).
#
# Preferred: scripts/device-bundle.sh here first (builds everything on the CPU machine and packs
# binaries + libraries + ../shared fixtures into .devbundle/bundle.tar.xz), carried to the device;
# this script then only unpacks it (BUILD_MODE=bundle). Without a bundle it builds on the device.
# Budget: < 8 minutes on an H100 including builds. Prints a short table last.
#
# Build: CMake + Ninja first. If the configure or build fails (e.g. the device image lacks the
# project's CPU dependencies: fmt, spdlog, nlohmann_json, CLI11, GTest, PCRE2, OpenBLAS), it falls
# back to a direct nvcc/g++ build of exactly what the check needs (the CUDA sources, the CPU
# reference cpu_attention.cpp + thread_pool.cpp, the test with real GTest if present, else
# tests/cuda/mini_gtest.h; tests/cuda/compat/fmt when fmt headers are missing).
#
# Env: OUT (copy results there), LRAGENT_COMMIT (commit id to report; else the bundle's, else the checkout's HEAD),
#      JOBS (default 16), QUICK=1 (bench only 8k shapes; for smoke runs),
#      FORCE_DIRECT=1 (use the direct nvcc build even when CMake works),
#      SKIP_KERNEL_BENCH=1 (tests, replay and serve stages only).
set -u
set -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PYTHONUNBUFFERED=1
JOBS=${JOBS:-16}
T0=$(date +%s)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
export PATH="$CUDA_HOME/bin:$PATH"

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU=${GPU:-unknown-gpu}
SLUG=$(echo "$GPU" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
DATE=$(date -u +%Y%m%d)
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || true)
if [ -n "$COMMIT" ] && [ -n "$(git status --porcelain 2>/dev/null | head -1)" ]; then COMMIT="$COMMIT-dirty"; fi
# The bundle's own commit (device-bundle.sh writes it) over this copy's .git, which on the GPU
# machine can be a stale one; LRAGENT_COMMIT over both.
if [ -f .devbundle/bundle.tar.xz ] && [ -s .devbundle/COMMIT ] && [ "${FORCE_DIRECT:-0}" != 1 ]; then
  COMMIT=$(cat .devbundle/COMMIT)
fi
COMMIT=${LRAGENT_COMMIT:-${COMMIT:-unknown}}
RES=bench/results
LOGS=build-gpu-logs  # logs stay out of the tree (ignored); only the report goes to bench/results
rm -rf "$LOGS"
mkdir -p "$RES" "$LOGS"
PREFIX=$RES/kernels-$SLUG-$DATE
echo "== gpu-check: $GPU, $DATE, commit $COMMIT, nvcc $($NVCC --version | tail -1)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv 2>/dev/null

elapsed() { echo $(( $(date +%s) - T0 ))s; }
# Copies what exists so far to $OUT (after every stage: a later stage that overruns the call's
# limit still leaves the earlier logs behind). The device tool brings back at most 8 files, so
# the reports (kernels and serve-*, paths under bench/results/) travel as one reports.tar.gz and
# the logs as one logs.tar.gz; the kernel report's .md comes back beside them to read at once.
save() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  local reports=() f
  for f in "$PREFIX.json" "$PREFIX.md" "$PREFIX.png" "$RES"/serve-*-"$(date -u +%Y%m%d)"*; do
    [ -e "$f" ] && reports+=("$f")
  done
  [ ${#reports[@]} -gt 0 ] && tar -czf "$OUT/reports.tar.gz" "${reports[@]}"
  [ -f "$PREFIX.md" ] && cp "$PREFIX.md" "$OUT/"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
  return 0
}

# ---------------------------------------------------------------- build
BUILD_MODE=cmake
B=build-gpu
TEST_BIN="" BENCH_BIN="" MODEL_BIN="" CLI_BIN=""
if [ -f .devbundle/bundle.tar.xz ] && [ "${FORCE_DIRECT:-0}" != 1 ]; then
  BUILD_MODE=bundle
  LB=/tmp/lragent-bundle
  rm -rf $LB && mkdir -p $LB && tar -C $LB -xJf .devbundle/bundle.tar.xz
  export LD_LIBRARY_PATH="$LB/lib:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
  export LRAGENT_SHARED=$LB/shared LRAGENT_SOURCE=$ROOT
  TEST_BIN=$LB/bin/lragent_cuda_tests BENCH_BIN=$LB/bin/lragent_attention_bench
  MODEL_BIN=$LB/bin/lragent_model_bench CLI_BIN=$LB/bin/lragent
  ldd $TEST_BIN $CLI_BIN | grep "not found" >"$LOGS/build.log"
elif true; then
{
  GEN=""
  command -v ninja >/dev/null && GEN="-G Ninja"
  cmake -S . -B $B $GEN -DCMAKE_BUILD_TYPE=Release -DLRAGENT_CUDA=ON -DLRAGENT_CUDA_ARCH=90a \
    -DLRAGENT_BUILD_TESTS=ON -DLRAGENT_BUILD_BENCH=OFF -DLRAGENT_CUDA_RESOURCE_USAGE=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" &&
    cmake --build $B -j "$JOBS" --target lragent_cuda_tests lragent_attention_bench
} >"$LOGS/build.log" 2>&1
if [ $? -eq 0 ] && [ "${FORCE_DIRECT:-0}" != 1 ] && [ -x $B/lragent_cuda_tests ] && [ -x $B/lragent_attention_bench ]; then
  TEST_BIN=$B/lragent_cuda_tests
  BENCH_BIN=$B/lragent_attention_bench
else
  BUILD_MODE=direct
  echo "== CMake build failed or FORCE_DIRECT=1 (tail of build.log below); falling back to a direct nvcc build"
  tail -15 "$LOGS/build.log"
  B=build-gpu-direct
  mkdir -p $B
  FL=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Isrc -DLRAGENT_CUDA_SM90A)
  {
    set -x
    pids=()
    for f in src/backend/cuda/*.cu; do
      "$NVCC" "${FL[@]}" --resource-usage -c "$f" -o "$B/$(basename "$f").o" &
      pids+=($!)
    done
    ok=1
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    [ $ok = 1 ] &&
      "$NVCC" "${FL[@]}" bench/cuda/attention_bench.cu $B/*.cu.o -o $B/lragent_attention_bench
    GT_LIBS=() DEFS=() INC=()
    if [ -f /usr/include/gtest/gtest.h ] && ls /usr/lib/x86_64-linux-gnu/libgtest_main.* /usr/lib/libgtest_main.* \
      /usr/local/lib/libgtest_main.* >/dev/null 2>&1; then
      GT_LIBS=(-lgtest_main -lgtest)
    else
      DEFS=(-DLRAGENT_MINI_GTEST)
    fi
    [ -f /usr/include/fmt/format.h ] || [ -f /usr/local/include/fmt/format.h ] || INC=(-Itests/cuda/compat)
    [ $ok = 1 ] &&
      g++ -std=c++20 -O2 -Isrc -Itests/cuda "${INC[@]}" -I"$CUDA_HOME/include" "${DEFS[@]}" \
        -x c++ tests/cuda/attention_cuda_test.cu -x none src/backend/cpu/cpu_attention.cpp src/core/thread_pool.cpp \
        $B/*.cu.o -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/targets/x86_64-linux/lib" -Wl,-rpath,"$CUDA_HOME/lib64" \
        -lcudart "${GT_LIBS[@]}" -lpthread -o $B/lragent_cuda_tests
    set +x
  } >>"$LOGS/build.log" 2>&1
  [ -x $B/lragent_cuda_tests ] && TEST_BIN=$B/lragent_cuda_tests
  [ -x $B/lragent_attention_bench ] && BENCH_BIN=$B/lragent_attention_bench
fi
fi
grep -E "Compiling entry|Used [0-9]+ registers|spill" "$LOGS/build.log" |
  sed -E "s/.*Compiling entry function '([^']*)'.*/\1/" >"$LOGS/resource-usage.txt" || true
echo "== build ($BUILD_MODE) done at $(elapsed): test=${TEST_BIN:-MISSING} bench=${BENCH_BIN:-MISSING}"
save

# ---------------------------------------------------------------- SASS summary
if [ -n "$BENCH_BIN" ] && command -v cuobjdump >/dev/null; then
  {
    echo "# per kernel: SASS instructions, HMMA, LDL/STL (local memory), MUFU"
    cuobjdump -sass "$BENCH_BIN" | awk '
      /Function :/ { f = $3 }
      /^ +\/\*[0-9a-f]+\*\// { n[f]++ }
      /HMMA/ { h[f]++ } /LDL|STL/ { l[f]++ } /MUFU/ { m[f]++ }
      END { for (k in n) printf "%-110s instr=%d hmma=%d ldl_stl=%d mufu=%d\n", k, n[k], h[k], l[k], m[k] }'
    echo
    echo "# cuobjdump --dump-resource-usage"
    cuobjdump --dump-resource-usage "$BENCH_BIN" 2>&1 | grep -E "Function|REG" | paste - - | sed -E 's/[[:space:]]+/ /g'
  } >"$LOGS/sass.txt" 2>&1
fi

# ---------------------------------------------------------------- tests
TESTS="not run"
if [ -n "$TEST_BIN" ]; then
  echo "== tests ($(elapsed))"
  if [ "$BUILD_MODE" = cmake ] && [ -z "${BUNDLE:-}" ]; then
    timeout 240 ctest --test-dir $B -R Cuda -V --timeout 200 >"$LOGS/test.log" 2>&1
    rc=$?
    SUMMARY="$(grep -E "tests passed|tests failed" "$LOGS/test.log" | tail -1), $(grep -c "(Skipped)" "$LOGS/test.log") skipped"
  else
    timeout 240 "$TEST_BIN" >"$LOGS/test.log" 2>&1
    rc=$?
    SUMMARY=$(grep -E "^\[==========\]|PASSED|FAILED" "$LOGS/test.log" | tail -3 | tr '\n' ' ')
  fi
  grep -E "Failure|FAILED|NaN!|error" "$LOGS/test.log" | head -30
  # Worst errors seen per kernel version.
  for v in v0 v1 v2 v3 v4 v5 v6; do
    grep -E "^([0-9]+: )?  $v " "$LOGS/test.log" | awk -v v=$v '{for(i=1;i<=NF;i++){if($i ~ /^bf16=/){split($i,a,"=");b=a[2]+0; if(b>mb)mb=b} if($i ~ /^f32=/){split($i,a,"=");f=a[2]+0; if(f>mf)mf=f}} n++}
      END {printf "  %s: %d checks, worst rel_l2 bf16=%.2e f32=%.2e\n", v, n, mb, mf}'
  done | tee "$LOGS/test-worst.txt"
  TESTS="rc=$rc ($BUILD_MODE) $SUMMARY; $(tr '\n' ';' <"$LOGS/test-worst.txt")"
  echo "== tests: $TESTS"
fi
save

# ---------------------------------------------------------------- benchmarks
# SKIP_KERNEL_BENCH=1: no kernel, model or GEMV bench, SDPA peer nor kernels report (a change that
# leaves the kernels alone: tests, replay and the serve stages only).
[ "${SKIP_KERNEL_BENCH:-0}" = 1 ] && BENCH_BIN="" MODEL_BIN=""
BQ=()
[ "${QUICK:-0}" = 1 ] && BQ=(--quick)
if [ -n "$BENCH_BIN" ]; then
  echo "== attention bench ($(elapsed))"
  timeout 180 "$BENCH_BIN" --out "$LOGS/attention_bench.json" "${BQ[@]}" 2>&1 | tee "$LOGS/bench.log"
fi
save
if [ -n "$MODEL_BIN" ]; then
  echo "== model bench ($(elapsed))"
  MQ=()
  [ "${QUICK:-0}" = 1 ] && MQ=(--quick)
  LRAGENT_CUDA_GRAPH_STATS=1 timeout 240 "$MODEL_BIN" --preset llama3.1-8b --ctx 4096 --prefill 8192 \
    --out "$LOGS/model_bench.json" "${MQ[@]}" 2>&1 | tee "$LOGS/model.log"
  echo "== model bench, decode launched op by op (--eager) ($(elapsed))"
  timeout 120 "$MODEL_BIN" --preset llama3.1-8b --ctx 4096 --prefill 0 --eager --out "$LOGS/model_bench_eager.json" \
    "${MQ[@]}" 2>&1 | tee -a "$LOGS/model.log"
  # Decode at a long context (agents' trajectories grow long): the step at 32k, where the KV
  # cache is a quarter of the bytes and decode attention weighs most (docs/cuda.md, session 29).
  echo "== model bench, decode at 32k context ($(elapsed))"
  timeout 150 "$MODEL_BIN" --preset llama3.1-8b --ctx 32768 --prefill 0 --out "$LOGS/model_bench_32k.json" \
    "${MQ[@]}" 2>&1 | tee -a "$LOGS/model.log"
  # Ministral-8B's shapes (intermediate 12288, 36 layers, 131k vocabulary), prefill and decode: launched in every
  # check, since a shape only it has (its down projection's 12288 staged floats) once failed the
  # GEMV's launch on the GPU from a22a222 to e629ff0 (sessions 26-29) while every Llama figure read fine.
  echo "== model bench, Ministral-8B decode ($(elapsed))"
  timeout 120 "$MODEL_BIN" --preset ministral-8b --ctx 4096 --prefill 2048 --out "$LOGS/model_bench_ministral.json" \
    "${MQ[@]}" 2>&1 | tee -a "$LOGS/model.log"
  # Qwen3-8B's shapes: its per-head q/k norms (head_rms_norm) run in every layer of the step.
  echo "== model bench, Qwen3-8B decode ($(elapsed))"
  timeout 120 "$MODEL_BIN" --preset qwen3-8b --ctx 4096 --prefill 2048 --out "$LOGS/model_bench_qwen3.json" \
    "${MQ[@]}" 2>&1 | tee -a "$LOGS/model.log"
  # Prefill on attention v5 (the previous default, docs/cuda.md): the same model, in model.log.
  echo "== model bench, prefill on attention v5 (LRAGENT_CUDA_PREFILL_KERNEL=v5) ($(elapsed))"
  LRAGENT_CUDA_PREFILL_KERNEL=v5 timeout 180 "$MODEL_BIN" --preset llama3.1-8b --ctx 4096 --prefill 8192 \
    --out "$LOGS/model_bench_v5.json" "${MQ[@]}" 2>&1 | tee -a "$LOGS/model.log"
fi
GEMV_BIN=${MODEL_BIN:+$(dirname "$MODEL_BIN")/lragent_gemv_bench}
if [ -n "$GEMV_BIN" ] && [ -x "$GEMV_BIN" ]; then
  echo "== decode GEMV bench ($(elapsed))"
  timeout 120 "$GEMV_BIN" --out "$LOGS/gemv_bench.json" 2>&1 | tee "$LOGS/gemv.log" | tail -3
fi
if [ -n "$CLI_BIN" ]; then
  echo "== lragent replay --device cuda, tinystories, every adapter set and mode (icarus too) ($(elapsed))"
  TS=$LRAGENT_SHARED/models/tinystories-656k
  for set in qkvo-shared-a-r4 qv-shared-a-r8 qv-indep-a-r8; do
  AD=$LRAGENT_SHARED/adapters/tinystories-656k/$set
  for mode in none full droidspeak base base-lr icarus; do
    for dev in "cpu" "cuda --dtype f32" "cuda --dtype bf16"; do
      # shellcheck disable=SC2086
      timeout 60 "$CLI_BIN" replay --model "$TS" --adapter plan=$AD/plan --adapter action=$AD/action \
        --adapter reflect=$AD/reflect --kv-share $mode --script examples/replay-hotpotqa.json --device $dev --json \
        >"$LOGS/replay-$set-$mode-${dev// /_}.json" 2>>"$LOGS/replay.log"
    done
    python3 - "$LOGS" "$set" "$mode" <<'PY' | tee -a "$LOGS/replay.log"
import json, sys
logs, aset, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def traj(dev):
    try:
        return json.load(open(f"{logs}/replay-{aset}-{mode}-{dev}.json")).get("trajectory", [])
    except Exception as e:
        return None
ref, f32, bf = traj("cpu"), traj("cuda_--dtype_f32"), traj("cuda_--dtype_bf16")
if not ref:
    # base-lr needs one lora_A across the agents: the independent-A set is refused (and says so)
    print(f"replay {aset} {mode:<10}: no CPU result (the mode refuses these adapters)"); sys.exit()
agree = lambda t: sum(a == b for a, b in zip(t or [], ref)) / len(ref)
# Position by position, one early flip shifts all that follows: the first differing position
# tells a rounding flip late in the trajectory from a path that parts at once.
first = lambda t: next((i for i, (a, b) in enumerate(zip(t or [], ref)) if a != b), min(len(t or []), len(ref)))
bf_note = "" if bf == ref else f" (first differs at token {first(bf)})"
print(f"replay {aset} {mode:<10} tokens {len(ref)}: cuda f32 identical={f32 == ref}, cuda bf16 agreement={agree(bf):.3f}{bf_note}")
PY
  done
  done
fi
save
if [ -n "$CLI_BIN" ] && [ -x "$CLI_BIN" ]; then
  # The OpenAI-compatible server: the same conversation on the CPU and the GPU (f32 must give the
  # CPU's texts), then the multi-agent trace over HTTP per sharing mode (docs/server.md).
  echo "== lragent serve: CPU vs CUDA, and the trace over HTTP ($(elapsed))"
  TS=$LRAGENT_SHARED/models/tinystories-656k
  AD=$LRAGENT_SHARED/adapters/tinystories-656k/qv-shared-a-r8
  for dev in "cpu" "cuda --dtype f32" "cuda --dtype bf16"; do
    # shellcheck disable=SC2086
    timeout 120 python3 scripts/serve-check.py --bin "$CLI_BIN" -- --model "$TS" --adapter plan=$AD/plan \
      --adapter action=$AD/action --adapter reflect=$AD/reflect --device $dev >"$LOGS/serve-check-${dev// /_}.json" \
      2>>"$LOGS/serve.log"
  done
  # reflect loaded at run time (POST /v1/load_lora_adapter) must answer as when served from the start.
  timeout 120 python3 scripts/serve-check.py --bin "$CLI_BIN" --load-reflect $AD/reflect -- --model "$TS" \
    --adapter plan=$AD/plan --adapter action=$AD/action --device cuda --dtype f32 \
    >"$LOGS/serve-check-runtime-lora.json" 2>>"$LOGS/serve.log"
  python3 - "$LOGS" <<'PY' | tee -a "$LOGS/serve.log"
import json, sys
logs = sys.argv[1]
def load(dev):
    try:
        return json.load(open(f"{logs}/serve-check-{dev}.json"))
    except Exception:
        return None
ref = load("cpu")
for dev in ("cuda_--dtype_f32", "cuda_--dtype_bf16"):
    d = load(dev)
    if not ref or not d:
        print(f"serve-check {dev}: no result"); continue
    same = [t["text"] for t in d["turns"]] == [t["text"] for t in ref["turns"]]
    lp, lr = d.get("logprobs"), ref.get("logprobs")
    lp_err = "n/a"
    if lp and lr and lp["tokens"] == lr["tokens"]:
        lp_err = max(abs(a - b) for a, b in zip(lp["token_logprobs"], lr["token_logprobs"]))
        for ta, tb in zip(lp["top_logprobs"], lr["top_logprobs"]):
            lp_err = max([lp_err] + [abs(ta[k] - tb[k]) for k in tb if k in ta])
        lp_err = f"{lp_err:.2e}"
    elif lp and lr:
        lp_err = "tokens differ"
    shaped = d.get("shaped") == ref.get("shaped")
    # bf16: a sampled request re-sent with its prompt cached may part from the first (its catch-up
    # rows take a GEMM, a single row the GEMV: rounding differs; docs/server.md); f32 must not.
    note = " (bf16: rounding depends on the pass's rows)" if "bf16" in dev else ""
    print(f"serve-check {dev}: greedy turns identical to cpu={same}, sampled reflect identical={d['reflect'] == ref['reflect']}, "
          f"stream = non-stream={d['stream_equals_plain']}{note}, logprobs max |diff| vs cpu={lp_err}, "
          f"logit_bias/min_tokens/min_p sample identical={shaped}, n=3 at once identical to cpu={d.get('n3') == ref.get('n3')} "
          f"(choices alike={len(set(d.get('n3') or [''])) == 1}, trajectories {d.get('n3_trajectories')}, copies {d.get('trajectories_copied')})")
rt, f32 = load("runtime-lora"), load("cuda_--dtype_f32")
if not rt or not f32:
    print("serve-check runtime-lora: no result")
else:
    keys = ("reflect", "reflect_stream", "logprobs", "shaped", "n3")
    print(f"serve-check runtime-lora (cuda f32, reflect loaded before its turn): {rt.get('load_reflect')!r}; "
          f"greedy turns identical={[t['text'] for t in rt['turns']] == [t['text'] for t in f32['turns']]}, "
          f"every later answer identical to reflect served from the start={all(rt.get(k) == f32.get(k) for k in keys)}, "
          f"unload: {rt.get('unload_reflect')!r}, reflect after it: HTTP {rt.get('reflect_after_unload')}")
PY
  SB_LENGTHS=4987,9095,17300,33700
  [ "${QUICK:-0}" = 1 ] && SB_LENGTHS=4987
  timeout 300 python3 scripts/serve-bench.py --bin "$CLI_BIN" --device cuda --preset llama3.1-8b --lengths $SB_LENGTHS \
    --modes none,full,base,base-lr --gpu-name "$GPU" --commit "$COMMIT" --out-dir "$RES" 2>>"$LOGS/serve.log" |
    tee -a "$LOGS/serve.log" | tail -8
  # Batching across requests: C independent clients at once against one at a time.
  SC_LEVELS=1,2,4,8,16
  [ "${QUICK:-0}" = 1 ] && SC_LEVELS=1,8
  timeout 240 python3 scripts/serve-concurrency.py --bin "$CLI_BIN" --device cuda --preset llama3.1-8b \
    --levels $SC_LEVELS --gpu-name "$GPU" --commit "$COMMIT" --out-dir "$RES" 2>>"$LOGS/serve.log" |
    tee -a "$LOGS/serve.log" | tail -9
  # Parallel agents on one prompt: each runs on a copy of the first's trajectory, against the same
  # requests one after another (docs/server.md).
  FO_LEVELS=1,3,8
  [ "${QUICK:-0}" = 1 ] && FO_LEVELS=1,3
  timeout 240 python3 scripts/serve-concurrency.py --bin "$CLI_BIN" --device cuda --preset llama3.1-8b --shared-prompt \
    --prompt 4096 --levels $FO_LEVELS --gpu-name "$GPU" --commit "$COMMIT" --out-dir "$RES" 2>>"$LOGS/serve.log" |
    tee -a "$LOGS/serve.log" | tail -7
  # The same over a 32k prompt, where the copies' shared blocks make the decode attention read the
  # prompt once for all of them (shared-prefix attention); and with --no-share-blocks (each copy
  # stores and reads the prompt again) for the comparison.
  if [ "${QUICK:-0}" != 1 ]; then
    for fo in "serve-fanout-32k" "serve-fanout-32k-copies --server-args=--no-share-blocks"; do
      set -- $fo
      timeout 240 python3 scripts/serve-concurrency.py --bin "$CLI_BIN" --device cuda --preset llama3.1-8b --shared-prompt \
        --prompt 32000 --levels 1,3,8,16 --name "$@" --gpu-name "$GPU" --commit "$COMMIT" --out-dir "$RES" \
        2>>"$LOGS/serve.log" | tee -a "$LOGS/serve.log" | tail -6
    done
  fi
fi
save
if [ "${SKIP_KERNEL_BENCH:-0}" != 1 ]; then
echo "== SDPA peer ($(elapsed))"
timeout 150 python3 bench/cuda/sdpa_peer.py --out "$LOGS/sdpa_peer.json" "${BQ[@]}" 2>&1 | tee "$LOGS/sdpa.log" | tail -12

# ---------------------------------------------------------------- report
python3 bench/cuda/make_report.py --ours "$LOGS/attention_bench.json" --sdpa "$LOGS/sdpa_peer.json" \
  --model "$LOGS/model_bench.json" --model-eager "$LOGS/model_bench_eager.json" \
  --model-extra "$LOGS/model_bench_v5.json" --model-long "$LOGS/model_bench_32k.json" "$LOGS/model_bench_ministral.json" "$LOGS/model_bench_qwen3.json" --gemv "$LOGS/gemv_bench.json" \
  --replay "$LOGS/replay.log" \
  --tests "$TESTS" --out-prefix "$PREFIX" \
  --meta "gpu=$GPU" "date=$DATE" "commit=$COMMIT" "build=$BUILD_MODE" "nvcc=$($NVCC --version | tail -1)" \
  "elapsed_s=$(( $(date +%s) - T0 ))"
fi

save
echo "== gpu-check done in $(elapsed); tests: $TESTS"
