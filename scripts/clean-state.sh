#!/usr/bin/env bash
# Removes what this project left on the machine outside the clone, so the next `make test`
# starts as on a new machine (a CI runner is one every time):
# - on a reachable Docker engine (DOCKER_HOST, else the default socket): the containers
#   labelled diloco-chaos.run, the volumes and images named diloco-chaos-* (the runtime,
#   the code volumes, the XLA compilation cache volume, the host image);
# - the private engine of scripts/dockerd.sh (stopped by its pid) and its folder
#   /tmp/diloco-dockerd (images and volumes in its data root), the two-host suite's
#   folders /tmp/diloco-hosts (its engines are stopped by the suite itself);
# - the report assets cache ~/.cache/diloco-chaos.
# Nothing this project did not create is touched. The clone's own .venv, .tools, .cache
# and runs/ go with `make clean` (or a new clone).
set -uo pipefail
cd "$(dirname "$0")/.."

if command -v docker >/dev/null 2>&1 && timeout 10 docker version >/dev/null 2>&1; then
  ids=$(docker ps -aq --filter label=diloco-chaos.run)
  [ -n "$ids" ] && docker rm -f $ids >/dev/null
  vols=$(docker volume ls -q | grep '^diloco-chaos-' || true)
  [ -n "$vols" ] && docker volume rm -f $vols >/dev/null
  imgs=$(docker images --format '{{.Repository}}:{{.Tag}}' | grep '^diloco-chaos-' || true)
  [ -n "$imgs" ] && docker rmi -f $imgs >/dev/null
  echo "clean-state: removed from ${DOCKER_HOST:-the default engine}: $(echo $ids | wc -w) containers, $(echo $vols | wc -w) volumes, $(echo $imgs | wc -w) images"
fi
bash scripts/dockerd.sh stop >/dev/null 2>&1 || true
for d in /tmp/diloco-dockerd /tmp/diloco-hosts; do
  if [ -d "$d" ]; then
    # a mount an engine left under it (netns, overlay) first: deepest first
    awk -v d="$d/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$d" && echo "clean-state: removed $d"
  fi
done
if [ -d "$HOME/.cache/diloco-chaos" ]; then
  rm -rf "$HOME/.cache/diloco-chaos" && echo "clean-state: removed ~/.cache/diloco-chaos"
fi
