#!/usr/bin/env bash
# The main job, end to end: the daemon against local RabbitMQ and Redis, a
# demo load with duplicates and bad messages, then the counts and counters.
source "$(dirname "$0")/lib.sh"
ensure_services
install_and_build >/dev/null

export TALLY_QUEUE="${TALLY_QUEUE:-tally.demo}"
export TALLY_PREFIX="${TALLY_PREFIX:-tally:demo:}"
# DEMO_SOURCE=stream: the same demo on a RabbitMQ stream (TALLY_SOURCE=stream), under names of its own.
if [ "${DEMO_SOURCE:-queue}" = stream ]; then
  export TALLY_SOURCE=stream TALLY_QUEUE="$TALLY_QUEUE.stream" TALLY_PREFIX="${TALLY_PREFIX}stream:"
fi
MESSAGES="${DEMO_MESSAGES:-20000}"
WORK="$(mktemp -d)"
trap 'kill "$DAEMON" 2>/dev/null || true; rm -rf "$WORK"' EXIT

# Start from an empty namespace so the numbers below are this run's.
node "$ROOT/bench/dist/src/reset-namespace.js"

echo "== starting the daemon (logs: $WORK/daemon.log)"
node "$ROOT/packages/coordinator/dist/src/main.js" >"$WORK/daemon.log" 2>&1 &
DAEMON=$!
until grep -q '"msg":"consuming"' "$WORK/daemon.log"; do
  if ! kill -0 "$DAEMON" 2>/dev/null; then cat "$WORK/daemon.log"; exit 1; fi
  sleep 0.2
done

echo "== publishing $MESSAGES messages over 1000 SKUs, 2% duplicate publishes, 1% bad messages"
pnpm --silent tally publish --messages "$MESSAGES" --skus 1000 --changes 1-8 \
  --duplicate-rate 0.02 --bad-rate 0.01 --seed 42 --truth "$WORK/truth.json"
PUBLISHED=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).published)' "$WORK/truth.json")

started=$(date +%s)
until [ "$(pnpm --silent tally stats --json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).received))')" -ge "$PUBLISHED" ]; do
  if [ $(( $(date +%s) - started )) -gt 300 ]; then echo "the daemon did not drain the queue in 300 s" >&2; exit 1; fi
  sleep 0.5
done

echo "== stopping the daemon with SIGTERM"
kill -TERM "$DAEMON"
wait "$DAEMON" && echo "daemon exited 0"

echo "== counts (first 10 of $(pnpm --silent tally counts --json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(Object.keys(JSON.parse(s)).length))') SKUs)"
pnpm --silent tally counts | head -10
echo "== counters"
pnpm --silent tally stats
echo "== against the ground truth"
pnpm --silent tally verify --truth "$WORK/truth.json"
if command -v rabbitmqctl >/dev/null 2>&1; then
  echo "== queues (ready messages)"
  rabbitmqctl -q list_queues name messages | grep -F "$TALLY_QUEUE" || true
fi
