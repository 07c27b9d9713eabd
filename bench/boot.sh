#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A Linux guest's boot over a remote base: a qcow2 overlay (empty, a
# local file) over a qcow2 base of a Debian 12 guest served over NBD by
# nbdkit's file plugin (2 ms on every read, as bench/remote.sh's base),
# the overlay served by
#   ours      our plugin (the base through libnbd)
#   qemu-nbd  qemu-nbd (its nbd driver)
# to QEMU booting the guest (its kernel and initrd given to QEMU, its
# root file system the served disk, virtio-blk) to systemd's
# multi-user.target, where a unit powers it off.  The guest's reads
# pass through nbdkit's nbd plugin with the log filter (the same for
# both servers), and the base's server logs what it sent: printed per
# round and server are the bytes the guest read, the bytes the base sent,
# bytes sent per byte read, the base's requests, and the seconds from
# QEMU's start to its exit.
# Usage: bench/boot.sh [ROUNDS]   (default 3; BOOT_KEEP=DIR keeps each
# boot's two logs there: guest-SERVER-TIME.log, base-SERVER-TIME.log;
# BOOT_BASE=http serves the base from a web server instead,
# tests/range-server.py, 2 ms before each answer, its bytes counted
# from the Range headers it was sent: ours reads it through nbdkit's
# curl plugin, qemu-nbd through its curl driver; BOOT_SERVERS="ours
# qemu-nbd" the servers, every other round in reverse order: builds of other
# trees as ours too, BENCH_TREES, bench/lib.sh)
#        bench/boot.sh guest      builds the guest only
# The guest (debootstrap --variant=minbase bookworm with a kernel and
# systemd, a 700 MiB qcow2) is built once into $BOOT_GUEST (default
# /var/tmp/boot-bench-guest), which needs debootstrap, mkfs.ext4, a
# Debian mirror and root.  QEMU emulates the CPU (TCG) unless
# BOOT_ACCEL=kvm (a nested KVM can hang the guest before its first
# line: this machine's did).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=$top:/usr/bin:/usr/sbin:$PATH
rounds=${1:-3}
guest=${BOOT_GUEST:-/var/tmp/boot-bench-guest}
for tool in qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap \
            qemu-nbd:qemu-utils nbdkit:nbdkit; do
  command -v "${tool%%:*}" > /dev/null || {
    echo "bench/boot.sh: ${tool%%:*} not found: install Debian's ${tool#*:}" >&2
    exit 1
  }
done

# The guest, built once: base.qcow2 (an ext4 file system, no partition
# table), vmlinuz and initrd.img.
guest_build ()
{
  local root=$guest.tmp/root mirror
  mirror=$(grep -rhs '^URIs: .*debian$\|^deb .*debian ' /etc/apt/sources.list.d /etc/apt/sources.list |
             grep -o 'https\?://[^ ]*' | head -1) || true
  rm -rf "$guest.tmp"
  mkdir -p "$guest.tmp"
  debootstrap --variant=minbase \
    --include=linux-image-amd64,systemd-sysv,udev,initramfs-tools,kmod \
    bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >&2
  echo boot-bench > "$root/etc/hostname"
  echo '/dev/vda / ext4 defaults 0 1' > "$root/etc/fstab"
  # Powers the guest off once the boot is done.
  cat > "$root/etc/systemd/system/boot-bench-done.service" <<'EOF'
[Unit]
Description=Power off at the end of the boot (bench/boot.sh)
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/systemctl --no-block poweroff

[Install]
WantedBy=multi-user.target
EOF
  ln -s /etc/systemd/system/boot-bench-done.service \
    "$root/etc/systemd/system/multi-user.target.wants/boot-bench-done.service"
  cp "$root"/boot/vmlinuz-* "$guest.tmp/vmlinuz"
  cp "$root"/boot/initrd.img-* "$guest.tmp/initrd.img"
  rm -rf "$root/var/cache/apt/archives"/*.deb
  mkfs.ext4 -q -F -L boot-bench -d "$root" "$guest.tmp/root.raw" 2G
  qemu-img convert -O qcow2 "$guest.tmp/root.raw" "$guest.tmp/base.qcow2"
  rm -rf "$root" "$guest.tmp/root.raw"
  rm -rf "$guest"
  mv "$guest.tmp" "$guest"
}
[ -s "$guest/base.qcow2" ] || guest_build
[ "${1:-}" = guest ] && exit 0

work=$(mktemp -d /var/tmp/boot-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
      bench_kill_pidfiles "$work"/*.pid; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
accel=${BOOT_ACCEL:-tcg}
base_kind=${BOOT_BASE:-nbd}

# serve NAME ARGS...: nbdkit on $work/NAME.sock, its pid in $work/NAME.pid.
serve ()
{
  local name=$1; shift
  nbdkit -U "$work/$name.sock" -P "$work/$name.pid" "$@"
  bench_wait_sock "$work/$name.sock" "$work/$name.pid"
}

# stop NAME: ends the server $work/NAME.pid names, and waits for it.
stop ()
{
  local pid
  pid=$(cat "$work/$1.pid")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$work/$1.sock" "$work/$1.pid"
}

# read_bytes LOG FROM: the bytes and the requests of the reads nbdkit's
# log filter logged in LOG from its byte FROM on.
read_bytes ()
{
  tail -c +"$(($2 + 1))" "$1" |
    /usr/bin/python3 -c '
import re, sys
got = n = 0
for line in sys.stdin:
    m = re.search(r" Read id=.* count=(0x[0-9a-f]+|[0-9]+)", line)
    if m:
        got += int(m.group(1), 0)
        n += 1
    m = re.match(r"Range: bytes=(\d+)-(\d+)", line)
    if m:
        got += int(m.group(2)) - int(m.group(1)) + 1
        n += 1
print(got, n)'
}

case $base_kind in
  nbd)
    serve base -r --filter=log --filter=delay file "$guest/base.qcow2" \
      delay-read=2ms logfile="$work/base.log"
    pids+=("$(cat "$work/base.pid")")
    backing="nbd+unix:///?socket=$work/base.sock" ;;
  http)
    mkdir "$work/web"
    ln -s "$guest/base.qcow2" "$work/web/base.qcow2"
    : > "$work/base.log"
    RANGE_SERVER_DELAY=0.002 RANGE_SERVER_LOG="$work/base.log" \
      /usr/bin/python3 "$top/tests/range-server.py" "$work/web" \
      "$work/http.port" &
    pids+=("$!")
    for i in $(seq 100); do [ -s "$work/http.port" ] && break; sleep 0.1; done
    backing="http://127.0.0.1:$(cat "$work/http.port")/base.qcow2" ;;
  *)
    echo "bench/boot.sh: BOOT_BASE=$base_kind: nbd or http" >&2; exit 1 ;;
esac

# one SERVER: boots the guest from a fresh overlay that SERVER serves;
# prints the bytes the guest read, the bytes and requests the base sent,
# and the seconds of the boot.
one ()
{
  local server=$1 from t0 t1 guest_read base_sent
  rm -f "$work/ovl.qcow2"
  qemu-img create -q -f qcow2 -F qcow2 -b "$backing" "$work/ovl.qcow2"
  case $(bench_kind "$server") in
    ours)
      "$(bench_nbdkit "$server")" -U "$work/s.sock" -P "$work/s.pid" \
        qcow2 "$work/ovl.qcow2"
      bench_wait_sock "$work/s.sock" "$work/s.pid" ;;
    qemu-nbd)
      qemu-nbd -t -f qcow2 -k "$work/s.sock" --pid-file="$work/s.pid" \
        "$work/ovl.qcow2" > /dev/null &
      bench_wait_sock "$work/s.sock" "$work/s.pid" ;;
  esac
  rm -f "$work/front.log"
  serve front --filter=log nbd socket="$work/s.sock" logfile="$work/front.log"
  from=$(wc -c < "$work/base.log")
  t0=$(date +%s.%N)
  timeout 1200 qemu-system-x86_64 -accel "$accel" -m 1G -smp 1 \
    -nodefaults -display none -no-reboot \
    -serial file:"$work/console-$server.log" \
    -kernel "$guest/vmlinuz" -initrd "$guest/initrd.img" \
    -append "root=/dev/vda ro console=ttyS0" \
    -drive file="nbd+unix:///?socket=$work/front.sock",format=raw,if=virtio
  t1=$(date +%s.%N)
  grep -q 'reboot: Power down' "$work/console-$server.log" ||
    { echo "$server: the guest did not power off; its console's end:" >&2
      tail -20 "$work/console-$server.log" >&2
      stop front; stop s; exit 1; }
  stop front
  stop s
  guest_read=$(read_bytes "$work/front.log" 0)
  base_sent=$(read_bytes "$work/base.log" "$from")
  echo "${guest_read% *} $base_sent $(echo "$t1 - $t0" | bc -l)"
  if [ -n "${BOOT_KEEP:-}" ]; then
    t1=$(date +%s)
    cp "$work/front.log" "$BOOT_KEEP/guest-$server-$t1.log"
    tail -c +"$((from + 1))" "$work/base.log" > "$BOOT_KEEP/base-$server-$t1.log"
  fi
}

declare -A per
servers=${BOOT_SERVERS:-ours qemu-nbd}
echo "guest boot over $base_kind ($accel), $rounds rounds; load average $(bench_load)"
echo "| round | server | guest read MiB | base sent MiB | sent/read | base requests | boot s |"
echo "|---|---|---|---|---|---|---|"
for r in $(seq "$rounds"); do
  for s in $(bench_order "$r" $servers); do
    out=$(one "$s")
    read -r g b n secs <<< "$out"
    per[$s]+="$(echo "$b / $g" | bc -l) "
    bench_record boot-sent-per-read "$s" "$r" "$(echo "$b / $g" | bc -l)"
    printf '| %d | %s | %.1f | %.1f | %.3f | %d | %.1f |\n' "$r" "$s" \
      "$(echo "$g / 1048576" | bc -l)" "$(echo "$b / 1048576" | bc -l)" \
      "$(echo "$b / $g" | bc -l)" "$n" "$secs"
  done
done
echo "bytes the base sent per byte read (medians), and against qemu-nbd's:"
q=$(bench_median "${per[qemu-nbd]:-}")
for s in $servers; do
  o=$(bench_median "${per[$s]}")
  printf '%s %.3f' "$s" "$o"
  [ "$q" = - ] || [ "$s" = qemu-nbd ] || printf ', %s/qemu-nbd %.3f' "$s" "$(echo "$o / $q" | bc -l)"
  echo
done
