#!/usr/bin/env bash
# Installs, builds, lints (eslint, import cycles, prettier --check) and runs
# every suite against the local RabbitMQ and Redis: the unit and integration
# tests, the fault-injection suite, and the benchmark's quick mode (which
# checks that every contender counts correctly, never a speed).
source "$(dirname "$0")/lib.sh"
STARTED=$SECONDS
ensure_services
ensure_apt_packages
install_and_build
echo "== installing and building took $((SECONDS - STARTED)) s"
LOG="$(mktemp)"
LINT_LOG="$(mktemp)"
status=0
run_step() {
  echo "== $*"
  local started=$SECONDS
  set +e
  "$@" 2>&1 | tee -a "$LOG"
  local step_status=${PIPESTATUS[0]}
  set -e
  # CI has a 30-minute budget: each step says what it spent of it.
  echo "== $* took $((SECONDS - started)) s"
  if [ "$step_status" -ne 0 ]; then
    echo "== FAILED ($step_status): $*"
    status=$step_status
  fi
}
# Lint, then the worker's suite, run alongside the other packages' unit and
# integration tests: lint is CPU work, and the worker's suite (about 2
# minutes) uses private redis-servers and prefixed keys on the shared one,
# while the coordinator's tests mostly wait on the servers. One job in the
# background at a time, so the foreground never shares the cores with two.
# Their output follows the foreground's; a failure is reported without
# stopping anything.
WORKER_LOG="$(mktemp)"
background_pid=""
# On any exit (an interrupt included) the background job goes too: its own
# process group, so its servers and test processes with it.
cleanup_background() {
  if [ -n "$background_pid" ]; then kill -- "-$background_pid" 2>/dev/null || true; fi
  rm -f "$LOG" "$LINT_LOG" "$WORKER_LOG" "$LINT_LOG.status" "$WORKER_LOG.status"
}
trap cleanup_background EXIT
background_step() {
  local started=$SECONDS
  "${@:2}" >"$1" 2>&1
  echo "$? $((SECONDS - started))" >"$1.status"
}
set -m # the background job gets its own process group, for the trap
(
  set +e
  background_step "$LINT_LOG" pnpm lint
  background_step "$WORKER_LOG" pnpm --filter @tally/worker test
) &
background_pid=$!
set +m
run_step pnpm exec turbo run test --concurrency=1 --continue --filter='!@tally/worker'
wait "$background_pid" || true
background_pid=""
# A background step's output, time and status, reported as run_step does.
report_background() {
  local name=$1 file=$2 step_status step_seconds
  echo "== $name (in the background)"
  tee -a "$LOG" <"$file"
  read -r step_status step_seconds <"$file.status" 2>/dev/null || { step_status=1; step_seconds='?'; }
  echo "== $name took $step_seconds s (in the background)"
  if [ "$step_status" -ne 0 ]; then
    echo "== FAILED ($step_status): $name"
    status=$step_status
  fi
}
report_background "pnpm lint" "$LINT_LOG"
report_background "pnpm --filter @tally/worker test" "$WORKER_LOG"
run_step pnpm test:faults
run_step pnpm bench --quick
# The steady-state drains on a small population (1,000 msg/s: 750k markers, still hashtables; the
# bucket of now half full, so --steady-phase runs end to end), the marker contenders and their
# references only (the stream contenders hold no markers, and drained fresh in the step above).
run_step pnpm bench --quick --steady-state --steady-rate 1000 --steady-phase 0.5 --contenders ceiling,batched,tally-two-step,tally-atomic
run_step pnpm bench --scale-out --quick
# One closing line over every mocha summary.
# (grep finds nothing when nothing failed: under pipefail that must not end the script)
passed=$({ grep -oE '[0-9]+ passing' "$LOG" || true; } | awk '{s+=$1} END {print s+0}')
failed=$({ grep -oE '[0-9]+ failing' "$LOG" || true; } | awk '{s+=$1} END {print s+0}')
# CI shows the tail of this output: repeat each mocha failure report there,
# so the failing test and its error are read without the whole log.
if [ "$failed" -gt 0 ]; then
  echo "== failures (repeated from above)"
  awk '/[0-9]+ failing/ {n = 60} n > 0 {print; n--}' "$LOG"
fi
echo "tests: ${passed} passed, ${failed} failed ($((SECONDS - STARTED)) s in all)"
exit "$status"
