#!/usr/bin/env bash
# Debian packages the tests use: promtool and prometheus (alert-rule and dashboard tests),
# chromium (status-page test). Installed when missing and we are root; otherwise a clear message.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
