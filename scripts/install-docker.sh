#!/usr/bin/env bash
# Idempotent: makes a Docker engine binary (dockerd) available for the `docker`
# backend's tests. Does nothing if dockerd is already on PATH or an engine is
# reachable through DOCKER_HOST / the default socket. Installs Debian's docker.io
# package otherwise (needs root and apt; skipped with a note when either is missing).
set -euo pipefail

if command -v dockerd >/dev/null 2>&1; then
  exit 0
fi
if command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  exit 0  # some engine is reachable already
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-docker: no dockerd and no root+apt; tests marked 'docker' will be skipped" >&2
  exit 0
fi
echo "install-docker: installing Debian's docker.io (once; ~1 min)"
export DEBIAN_FRONTEND=noninteractive
# the package's service scripts must not start an engine here: scripts/dockerd.sh does
if ! apt-get install -y -q --no-install-recommends docker.io >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends docker.io >/dev/null
fi
command -v dockerd >/dev/null
