#!/usr/bin/env bash
# Install the Debian packages the local cluster needs, only those missing.
# prometheus: the e2e Prometheus test and promtool; npm + unzip: hack/install-helm.sh.
# Idempotent; needs root. Adds a bookworm deb-src line so `apt-get source kubernetes` works.
set -euo pipefail
PKGS=(etcd-server containerd runc containernetworking-plugins iptables conntrack dnsmasq-base
      buildah umoci debootstrap golang-go golang-github-modern-go-reflect2-dev dpkg-dev
      build-essential rsync iproute2 util-linux procps kmod psmisc ca-certificates openssl busybox-static
      prometheus npm unzip)
# `install-deps.sh PKG...` installs only those (e.g. the unit tier's prometheus for promtool).
if [ $# -gt 0 ]; then PKGS=("$@"); fi
if [ "$(id -u)" != 0 ]; then echo "install-deps: needs root (run as root or with sudo)" >&2; exit 1; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
SRC=/etc/apt/sources.list.d/disttrain-src.list
need_update=0
if [ ! -f "$SRC" ]; then
  # apt refuses one source listed twice with different Signed-By, so reuse whatever the
  # machine's own entry for deb.debian.org says (deb822 Signed-By or one-line signed-by=).
  key=$(awk 'BEGIN{RS=""; IGNORECASE=1} /deb\.debian\.org\/debian([[:space:]]|$)/ && match($0, /Signed-By:[[:space:]]*[^[:space:]]+/) {
           v=substr($0, RSTART, RLENGTH); sub(/Signed-By:[[:space:]]*/, "", v); print v; exit}' \
         /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -z "$key" ] && key=$(grep -hoE '^deb[[:space:]]+\[[^]]*signed-by=[^] ]+[^]]*\][[:space:]]+https?://deb\.debian\.org/debian[[:space:]]' \
         /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | grep -oE 'signed-by=[^] ]+' | head -1 | cut -d= -f2 || true)
  opt=""; [ -n "$key" ] && opt="[signed-by=$key] "
  echo "deb-src ${opt}http://deb.debian.org/debian bookworm main" > "$SRC"; need_update=1
fi
if [ ${#missing[@]} -gt 0 ] || [ $need_update = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
