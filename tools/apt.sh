# Sourced by tools/install.sh and tools/peers.sh: install Debian packages that are missing.
#
#   apt_install_missing LABEL PACKAGE...
#
# As root with apt-get: installs those of PACKAGE... that dpkg does not list as installed,
# saying so with LABEL in front. Otherwise does nothing (the caller checks for what it needs).

apt_install_missing() {
  local label=$1; shift
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "$label: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
