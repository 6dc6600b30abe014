#!/usr/bin/env bash
# Debian packages the tests use, installed when missing (and we are root); otherwise a clear
# message naming them:
#   python3-venv                `make venv` (python3 -m venv needs ensurepip)
#   prometheus                  promtool (alert-rule and dashboard tests)
#   chromium                    the status-page test
#   containerd, runc,           the real worker node of `make e2e` (localkube's node harness)
#   containernetworking-plugins,
#   iptables, nftables, conntrack, iproute2 (ip)
#   mmdebstrap, umoci, skopeo   `make image` (the container image, without a daemon)
# Versions: Debian 12 (bookworm) ships containerd 1.6.20, runc 1.1.5, CNI plugins 1.1.1,
# mmdebstrap 1.3.5, umoci 0.4.7, skopeo 1.9.3; the node harness is tested with these.
set -euo pipefail

# command -> package providing it (a file path for packages that ship no command on PATH,
# py:MODULE for a module of the system's python3)
checks=(
  "py:ensurepip python3-venv"
  "promtool prometheus"
  "chromium chromium"
  "containerd containerd"
  "ctr containerd"
  "runc runc"
  "/usr/lib/cni/bridge containernetworking-plugins"
  "/usr/lib/cni/host-local containernetworking-plugins"
  "/usr/lib/cni/loopback containernetworking-plugins"
  "iptables iptables"
  "nft nftables"
  "conntrack conntrack"
  "ip iproute2"
  "mmdebstrap mmdebstrap"
  "umoci umoci"
  "skopeo skopeo"
)
need=()
for check in "${checks[@]}"; do
  read -r what pkg <<<"$check"
  if [[ "$what" == py:* ]]; then
    "${PYTHON:-python3}" -c "import ${what#py:}" >/dev/null 2>&1 && continue
  elif [[ "$what" == /* ]]; then
    [[ -x "$what" ]] && continue
  else
    # sbin is not on every user's PATH (runc, iptables live there).
    PATH="$PATH:/usr/sbin:/sbin" command -v "$what" >/dev/null 2>&1 && continue
  fi
  [[ " ${need[*]} " == *" $pkg "* ]] || need+=("$pkg")
done
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a parallel checkout's `make test`) holds the lock for a while: wait for it.
apt_opts=(-o DPkg::Lock::Timeout=600)
apt-get "${apt_opts[@]}" update -qq >/dev/null
apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
