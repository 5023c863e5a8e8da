#!/usr/bin/env bash
# Runs a command beside N busy processes, as on a shared CI runner:
#   scripts/with-load.sh [-n N] [-t SECONDS] -- COMMAND...
# Each spinner is a pure-Python loop that ends by itself after SECONDS (default 3600),
# niced like nothing (the same priority as the command). They are stopped by their pids when the
# command ends, fails or is interrupted. Exit status: the command's.
set -uo pipefail
n=2 limit=3600
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    -t) limit="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "with-load.sh: unknown option $1 (usage: with-load.sh [-n N] [-t SECONDS] -- COMMAND...)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "with-load.sh: no command (usage: with-load.sh [-n N] [-t SECONDS] -- COMMAND...)" >&2; exit 2; }
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait "${pids[@]}" 2>/dev/null; }
trap stop EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$n"); do
  python3 -c "import time
end = time.monotonic() + $limit
while time.monotonic() < end:
    sum(range(10000))" &
  pids+=("$!")
done
echo "with-load: $n spinners (pids ${pids[*]}, at most ${limit} s each) beside: $*" >&2
"$@"
