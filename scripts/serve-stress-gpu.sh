#!/usr/bin/env bash
# scripts/serve-stress.py against `lragent serve --device cuda` on the GPU machine, with the
# bundle's tinystories-656k and its qv-shared-a-r8 agents (after scripts/device-bundle.sh here;
# carry .devbundle and .fixtures/llama3, whose tokenizer_config.json holds the chat template):
#   f32-none     --dtype f32 --kv-share none, --exact: every answer equals the request alone;
#   f32-baselr   --dtype f32 --kv-share base-lr: the unshared requests equal theirs;
#   bf16-baselr  the same in bf16: reported, not judged. A GEMM over a batch's rows and a GEMV
#                over one round differently, so long greedy outputs may part (docs/server.md);
#   f32-none-kv4 f32-none in a 4 MB KV memory (--kv-cache-memory 0.004) and 64 trajectories:
#                trajectories dropped and requests preempted by the dozen, every answer still
#                its request's alone.
# A run whose server warns that its engine stalled fails (the warning is printed).
# Env: OUT (logs go there; default build-stress-logs), ROUNDS (default 2), ONLY (one run's name).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-build-stress-logs}
mkdir -p "$OUT"
LB=/tmp/lragent-stress-bundle
rm -rf $LB && mkdir -p $LB && tar -C $LB -xJf .devbundle/bundle.tar.xz
export LD_LIBRARY_PATH="$LB/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
A=$LB/shared/adapters/tinystories-656k/qv-shared-a-r8
TEMPLATE=$LB/llama3.jinja
python3 -c "import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))['chat_template'])" \
  .fixtures/llama3/tokenizer_config.json >"$TEMPLATE" || exit 1
STATUS=0
run() {  # NAME PORT JUDGED STRESS-FLAGS -- serve flags...
  local name=$1 port=$2 judged=$3 sflags=$4
  shift 4
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && return
  $LB/bin/lragent serve --device cuda --model $LB/shared/models/tinystories-656k --adapter plan=$A/plan \
    --adapter action=$A/action --adapter reflect=$A/reflect --chat-template "$TEMPLATE" \
    --port "$port" --max-sessions "${SESSIONS:-4}" --quiet "$@" 2>"$OUT/serve-$name.err" &
  local pid=$!
  for _ in $(seq 150); do grep -q serving "$OUT/serve-$name.err" && break; sleep 0.2; done
  # shellcheck disable=SC2086
  timeout 300 python3 scripts/serve-stress.py --port "$port" --rounds "${ROUNDS:-2}" $sflags >"$OUT/stress-$name.log" 2>&1
  local rc=$?
  kill -INT $pid
  wait $pid
  local serve_rc=$?
  echo "$name: stress exit $rc ($(tail -1 "$OUT/stress-$name.log")), serve exit $serve_rc"
  [ "$serve_rc" = 0 ] || STATUS=1
  # The engine's stall warning (ServerOptions::stall_warning) fails every run, judged or not.
  if grep "engine stalled" "$OUT/serve-$name.err"; then STATUS=1; fi
  [ "$judged" = yes ] && [ "$rc" != 0 ] && STATUS=1
}
run f32-none 18200 yes --exact --dtype f32 --kv-share none
run f32-baselr 18201 yes "" --dtype f32 --kv-share base-lr
run bf16-baselr 18202 no "" --kv-share base-lr
SESSIONS=64 run f32-none-kv4 18203 yes --exact --dtype f32 --kv-share none --kv-cache-memory 0.004
exit $STATUS
