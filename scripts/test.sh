#!/usr/bin/env bash
# Installs, builds and runs every test suite against the local RabbitMQ and Redis.
source "$(dirname "$0")/lib.sh"
ensure_services
install_and_build
pnpm test
