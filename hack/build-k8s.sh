#!/usr/bin/env bash
# Build (or find) the Kubernetes v1.20.2 binaries and the static pause binary; cache them
# under $DISTTRAIN_CACHE/k8s/<version>-<patches>/bin. Prints that folder on stdout.
#
# Source: Debian's `kubernetes` source package (bookworm), built with Debian's golang-go.
# vendor/github.com/modern-go/reflect2 v1.0.1 panics under Go >= 1.18 (nil dereference in
# mapiterinit) on the first custom-resource write, so it is replaced by Debian's 1.0.2.
# The patches in hack/k8s-patches/ (each says why) are applied for the build and reverted
# after it, so the tree stays Debian's; the cache folder is named by their hash, so a changed
# patch builds anew.
set -euo pipefail
VERSION=v1.20.2
CACHE=${DISTTRAIN_CACHE:-$HOME/.cache/disttrain}
shopt -s nullglob
PATCHES=("$(cd "$(dirname "$0")" && pwd)"/k8s-patches/*.patch)
shopt -u nullglob
PATCH_ID=$( ((${#PATCHES[@]})) && cat "${PATCHES[@]}" | sha256sum | cut -c1-12 || echo none)
BIN=$CACHE/k8s/$VERSION-$PATCH_ID/bin
SRC=$CACHE/src
WANT=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
log() { echo "build-k8s: $*" >&2; }

have_all() { local d=$1; for b in "${WANT[@]}"; do [ -x "$d/$b" ] || return 1; done; }

if have_all "$BIN" && [ -x "$BIN/pause" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$BIN"

# envtest convention: KUBEBUILDER_ASSETS may already hold (some of) the binaries; the kubelet
# is built here whenever there are patches (they change the kubelet only).
if [ -n "${KUBEBUILDER_ASSETS:-}" ] && have_all "$KUBEBUILDER_ASSETS"; then
  log "using binaries from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  for b in "${WANT[@]}"; do
    if [ "$b" != kubelet ] || [ "$PATCH_ID" = none ]; then ln -sf "$KUBEBUILDER_ASSETS/$b" "$BIN/$b"; fi
  done
fi

mkdir -p "$SRC"
tree=$(find "$SRC" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
if [ -z "$tree" ]; then
  log "fetching Debian's kubernetes source package into $SRC"
  (cd "$SRC" && apt-get source -q kubernetes >&2)
  tree=$(find "$SRC" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
fi
[ -n "$tree" ] || { log "apt-get source kubernetes produced no tree (is the deb-src line there? run hack/install-deps.sh)"; exit 1; }

R2=vendor/github.com/modern-go/reflect2
if [ ! -f "$tree/$R2/.disttrain-swapped" ]; then
  log "replacing $R2 with Debian's golang-github-modern-go-reflect2-dev"
  rm -rf "${tree:?}/$R2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$tree/$R2"
  rm -f "$tree/$R2/go.mod" "$tree/$R2/go.sum"
  touch "$tree/$R2/.disttrain-swapped"
fi

applied() { patch -p1 -R -d "$tree" --dry-run -s -f < "$1" >/dev/null 2>&1; }
revert_patches() {
  local i
  for ((i = ${#PATCHES[@]} - 1; i >= 0; i--)); do
    if applied "${PATCHES[$i]}"; then patch -p1 -R -d "$tree" -s -f < "${PATCHES[$i]}"; fi
  done
}

# The patches change the kubelet only: the other binaries of an earlier build of this version
# (another patch set, or none) are the same.
for d in "$CACHE/k8s/$VERSION"*/bin; do
  for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
    if [ ! -x "$BIN/$b" ] && [ -x "$d/$b" ] && [ ! -L "$d/$b" ]; then cp "$d/$b" "$BIN/$b"; fi
  done
done
missing=()
for b in "${WANT[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if ((${#missing[@]})); then
  log "building ${missing[*]} (about 6 minutes on 2 cores for all five)"
  trap revert_patches EXIT
  for p in "${PATCHES[@]}"; do
    applied "$p" || patch -p1 -d "$tree" -s -f < "$p" || { log "patch $p does not apply to $tree"; exit 1; }
  done
  # As Debian's debian/rules does: a private GOPATH, no network, vendored modules.
  export GOPATH=$SRC/gopath GOCACHE=$SRC/gocache GOFLAGS=-mod=vendor GO111MODULE=on GOPROXY=off
  export KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean
  (cd "$tree" && make WHAT="${missing[*]/#/cmd/}" >&2)
  for b in "${missing[@]}"; do
    f=$(find "$tree/_output" -type f -name "$b" -perm -u+x | head -1)
    [ -n "$f" ] || { log "make did not produce $b"; exit 1; }
    cp "$f" "$BIN/$b"
  done
  revert_patches
  trap - EXIT
fi

if [ ! -x "$BIN/pause" ]; then
  log "compiling the static pause binary from build/pause/linux/pause.c"
  gcc -Os -static -Wall -Werror -DVERSION=3.2-disttrain -o "$BIN/pause" "$tree/build/pause/linux/pause.c"
  strip "$BIN/pause"
fi
echo "$BIN"
