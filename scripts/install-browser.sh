#!/usr/bin/env bash
# Installs a headless browser for the report tests (suites/browser/): Debian's
# `chromium` (and `chromium-driver`). Idempotent: does nothing when a Chromium is
# already on PATH. Without root it installs nothing and says what to run.
# The tests drive the system browser through Playwright for Python
# (executable_path), so Playwright's own browser download is never needed.
set -euo pipefail

for b in chromium chromium-browser google-chrome-stable google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then
    echo "install-browser: using $(command -v "$b")"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: no chromium on PATH and no apt-get here; install Chromium (or Chrome) by hand," >&2
  echo "  or set CHAOS_BROWSER=/path/to/chromium. The browser tests skip without one." >&2
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-browser: no chromium on PATH. Install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y chromium chromium-driver" >&2
  echo "  (the browser tests skip until then)" >&2
  exit 0
fi

echo "install-browser: installing Debian's chromium and chromium-driver (once; ~1-2 min)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "install-browser: installed $(command -v chromium)"
