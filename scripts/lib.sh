# Shared by demo.sh, test.sh and .ci/run: puts pnpm 12.4.2 on PATH and makes
# sure RabbitMQ and Redis answer on their local ports.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TURBO_TELEMETRY_DISABLED=1 DO_NOT_TRACK=1
PNPM_VERSION=12.4.2

ensure_pnpm() {
  if command -v pnpm >/dev/null 2>&1 && [ "$(pnpm --version 2>/dev/null)" = "$PNPM_VERSION" ]; then return; fi
  # A project-local copy: no global install, no corepack (it does not work here).
  if [ ! -x "$ROOT/.tools/node_modules/.bin/pnpm" ]; then
    echo "installing pnpm $PNPM_VERSION into .tools/" >&2
    npm install --silent --no-audit --no-fund --prefix "$ROOT/.tools" "pnpm@$PNPM_VERSION" >&2
  fi
  export PATH="$ROOT/.tools/node_modules/.bin:$PATH"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local port=$1 name=$2
  for _ in $(seq 1 120); do
    if port_open "$port"; then return 0; fi
    sleep 1
  done
  echo "$name did not answer on 127.0.0.1:$port" >&2
  return 1
}

ensure_services() {
  if ! port_open 6379; then
    echo "starting redis-server" >&2
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no >&2
  fi
  if ! port_open 5672; then
    echo "starting rabbitmq-server" >&2
    rabbitmq-server -detached >&2 || true
  fi
  wait_port 6379 Redis
  wait_port 5672 RabbitMQ
  # TALLY_PARTITIONS > 1 needs the consistent-hash exchange type; the plugin
  # ships with RabbitMQ and enables offline (a running node loads it at once).
  if command -v rabbitmq-plugins >/dev/null 2>&1; then
    rabbitmq-plugins enable rabbitmq_consistent_hash_exchange >/dev/null 2>&1 ||
      echo "warning: could not enable rabbitmq_consistent_hash_exchange; the partition tests will fail" >&2
  fi
  # The port opens before the broker accepts logins; wait until it does.
  if command -v rabbitmqctl >/dev/null 2>&1; then
    for _ in $(seq 1 60); do
      if rabbitmqctl -q await_startup >/dev/null 2>&1; then break; fi
      sleep 1
    done
  fi
}

# Debian packages the tests drive: promtool and prometheus (package
# prometheus: metrics lint, rule unit tests, a real scrape) and systemd-analyze
# (package systemd: the service unit). Installs only what is missing, with one
# quiet apt-get update first; never starts the distro's prometheus service
# (policy-rc.d refuses service starts during the install).
APT_PACKAGES=(prometheus systemd)

ensure_apt_packages() {
  local missing=()
  local package
  for package in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then missing+=("$package"); fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then return; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing Debian packages: ${missing[*]} (and no apt-get to install them)" >&2
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "installing Debian packages: ${missing[*]}" >&2
  local policy=/usr/sbin/policy-rc.d created_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod +x "$policy" && created_policy=1
  fi
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  if [ -n "$created_policy" ]; then $sudo rm -f "$policy"; fi
}

install_and_build() {
  ensure_pnpm
  cd "$ROOT"
  pnpm install --frozen-lockfile
  pnpm build
}
