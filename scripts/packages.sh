# SPDX-License-Identifier: BSD-3-Clause
# Sourced by scripts/setup.sh and scripts/test.sh:
#   install_missing PACKAGE...
# installs the Debian packages not installed yet, and no more.  Nothing
# it installs is left running or enabled: a package that ships a
# service (openssh-server's ssh.service) starts it and enables it at
# boot on install, so installs run under a policy-rc.d that forbids
# starting services (removed by a trap if interrupted), and the
# services of every package the install added (the dependencies too)
# are then disabled, and checked.

_pkg_sudo=
[ "$(id -u)" -eq 0 ] || _pkg_sudo=sudo

_pkg_installed ()
{
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null |
    awk '$1 == "ii" { print $2 }' | sort
}

# The systemd units (not templates) and init scripts of packages.
_pkg_services ()
{
  local p
  for p in "$@"; do
    dpkg-query -L "$p" 2>/dev/null
  done | grep -E '^(/usr)?/lib/systemd/system/[^/@]+\.(service|socket)$|^/etc/init\.d/[^/]+$' |
    sort -u
}

install_missing ()
{
  local p missing=() added unit name before policy=/usr/sbin/policy-rc.d
  local made_policy= r=0 bad= saved_traps sig
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "installing ${missing[*]}"
  before=$(_pkg_installed)
  if [ ! -e "$policy" ]; then
    # Removed if the install is interrupted too: then the caller's
    # traps are put back before exiting, so that its EXIT trap runs.
    saved_traps=$(trap -p INT TERM HUP)
    for sig in HUP:129 INT:130 TERM:143; do
      trap "$_pkg_sudo rm -f $policy; trap - INT TERM HUP;
            eval \"\$saved_traps\"; exit ${sig#*:}" "${sig%:*}"
    done
    # invoke-rc.d (and deb-systemd-invoke) ask it before starting a
    # service: 101, not allowed.
    printf '#!/bin/sh\nexit 101\n' | $_pkg_sudo tee "$policy" >/dev/null
    $_pkg_sudo chmod 755 "$policy"
    made_policy=1
  fi
  $_pkg_sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $_pkg_sudo apt-get install -y -qq \
      "${missing[@]}" >/dev/null || r=$?
  if [ -n "$made_policy" ]; then
    $_pkg_sudo rm -f "$policy"
    trap - INT TERM HUP
    eval "$saved_traps"
  fi
  [ $r -eq 0 ] || return $r
  added=$(comm -13 <(echo "$before") <(_pkg_installed))
  for unit in $(_pkg_services $added); do
    name=${unit##*/}
    case "$unit" in
      /etc/init.d/*)
        ! command -v update-rc.d >/dev/null ||
          $_pkg_sudo update-rc.d "$name" disable >/dev/null 2>&1 || true ;;
      *)
        # disable works without a running systemd (it edits links).
        ! command -v systemctl >/dev/null ||
          $_pkg_sudo systemctl disable "$name" >/dev/null 2>&1 || true
        [ ! -d /run/systemd/system ] ||
          $_pkg_sudo systemctl stop "$name" >/dev/null 2>&1 || true ;;
    esac
  done
  for unit in $(_pkg_services $added); do
    name=${unit##*/}
    case "$unit" in
      /etc/init.d/*)
        ! ls /etc/rc[2-5].d/S??"$name" >/dev/null 2>&1 || bad="$bad $name" ;;
      *)
        command -v systemctl >/dev/null || continue
        case $(systemctl is-enabled "$name" 2>/dev/null) in
          enabled|enabled-runtime) bad="$bad $name" ;;
        esac
        [ ! -d /run/systemd/system ] ||
          ! systemctl is-active --quiet "$name" || bad="$bad $name" ;;
    esac
  done
  if [ -n "$bad" ]; then
    echo "install_missing: left enabled or running:$bad" >&2
    return 1
  fi
}
