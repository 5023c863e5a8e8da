#!/usr/bin/env bash
# A private Docker engine for machines with no running one (like CI):
#   scripts/dockerd.sh start   starts dockerd (idempotent), prints its DOCKER_HOST
#   scripts/dockerd.sh stop    stops the dockerd this script started (by its pid, never by name)
#   scripts/dockerd.sh status  prints DOCKER_HOST and exits 0 while it answers
# Everything lives under $DILOCO_DOCKERD_DIR (default /tmp/diloco-dockerd): socket, data root
# (vfs storage), exec root, pid file, log. No iptables, no bridge: containers use host networking.
# Needs root and dockerd on PATH (scripts/install-docker.sh installs Debian's docker.io).
set -euo pipefail

DIR="${DILOCO_DOCKERD_DIR:-/tmp/diloco-dockerd}"
SOCK="$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"
HOST="unix://$SOCK"

answers() {
  DOCKER_HOST="$HOST" timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || curl -sf --max-time 5 --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1
}

our_pid() {  # the pid we started, if it is still that dockerd
  [ -f "$PIDFILE" ] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  [ -n "$pid" ] && [ -d "/proc/$pid" ] && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

case "${1:-}" in
  start)
    if our_pid >/dev/null && answers; then echo "$HOST"; exit 0; fi
    command -v dockerd >/dev/null || { echo "dockerd.sh: dockerd not found (run scripts/install-docker.sh)" >&2; exit 2; }
    mkdir -p "$DIR/data" "$DIR/exec"
    rm -f "$SOCK" "$PIDFILE"
    # own session: a Ctrl-C at the terminal reaches the harness, which then stops us in order
    setsid dockerd --iptables=false --ip-masq=false --bridge=none --storage-driver=vfs \
      --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pidfile" \
      -H "$HOST" >"$DIR/dockerd.log" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
      if answers; then echo "$HOST"; exit 0; fi
      our_pid >/dev/null || { echo "dockerd.sh: dockerd exited; log:" >&2; tail -20 "$DIR/dockerd.log" >&2; exit 1; }
      sleep 0.5
    done
    echo "dockerd.sh: dockerd did not answer in 60 s; log:" >&2; tail -20 "$DIR/dockerd.log" >&2
    exit 1
    ;;
  stop)
    pid="$(our_pid || true)"
    if [ -n "$pid" ]; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
      if [ -d "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    # what dockerd mounted under its folder and left (exec/netns/default): deepest first
    awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
      umount -l "$m" 2>/dev/null || true
    done
    rm -f "$PIDFILE" "$SOCK"
    ;;
  status)
    if answers; then echo "$HOST"; exit 0; fi
    exit 1
    ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
