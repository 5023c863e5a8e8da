#!/usr/bin/env bash
# Installs the real Toxiproxy server (Shopify's Go binary, pinned) into .tools/.
# Order: .tools/toxiproxy-server already there -> a toxiproxy-server on PATH ->
# `go install` of the pinned module. Stops with a clear message if none works.
set -euo pipefail
VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
TOOLS="${1:-.tools}"
mkdir -p "$TOOLS"
TOOLS="$(cd "$TOOLS" && pwd)"

if [ -x "$TOOLS/toxiproxy-server" ]; then
  exit 0
fi
if command -v toxiproxy-server >/dev/null 2>&1; then
  ln -sf "$(command -v toxiproxy-server)" "$TOOLS/toxiproxy-server"
  echo "using toxiproxy-server from PATH: $(command -v toxiproxy-server)"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
setup: no Toxiproxy server found and Go is not installed, so it cannot be built.
Get one of:
  - Go >= 1.23 (then re-run: make setup), or
  - the release binary toxiproxy-server-linux-amd64 from github.com/Shopify/toxiproxy/releases ($VERSION), put on PATH as toxiproxy-server, or
  - Homebrew: brew install toxiproxy, or
  - Docker: docker run -p 8474:8474 ghcr.io/shopify/toxiproxy (then point the harness at it).
MSG
  exit 1
fi
echo "setup: building Toxiproxy $VERSION with $(go version | cut -d' ' -f3) (once; ~1 min)"
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
# go install names the binaries after their folders (server, cli): install into a
# scratch GOBIN, then rename.
GOBIN="$BUILD" GOFLAGS=-mod=mod go install \
  "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION" \
  "github.com/Shopify/toxiproxy/v2/cmd/cli@$VERSION"
mv "$BUILD/cli" "$TOOLS/toxiproxy-cli"
mv "$BUILD/server" "$TOOLS/toxiproxy-server"
"$TOOLS/toxiproxy-server" -version
