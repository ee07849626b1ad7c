#!/usr/bin/env bash
# Installs, builds and runs every test suite against the local RabbitMQ and Redis.
source "$(dirname "$0")/lib.sh"
ensure_services
install_and_build
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
set +e
pnpm test 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e
# One closing line over every package's mocha summary.
passed=$(grep -oE '[0-9]+ passing' "$LOG" | awk '{s+=$1} END {print s+0}')
failed=$(grep -oE '[0-9]+ failing' "$LOG" | awk '{s+=$1} END {print s+0}')
echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
