#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The nbdkit helpers that libnbd starts for a backing file on a web
# server end with the server that uses them, however it ends: killed
# (SIGKILL: nothing of ours runs), forked into the background (the
# process that opened the image exits), or --run ending; and none
# leaves its socket folder (/tmp/libnbdXXXXXX) behind.  One that cannot
# be started (no nbdkit in PATH) is said so.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
requires_nbdkit_plugin curl
source "${srcdir:-.}/remote-functions.sh"

# libnbd runs "nbdkit" from PATH: this one notes each helper's pid and
# the name of the socket it was given (LISTEN_FDS: fd 3), then runs the
# real one in the same process.
real=$(type -P nbdkit)
mkdir "$tmp/bin"
cat > "$tmp/bin/nbdkit" <<SCRIPT
#!/usr/bin/env bash
if [ -n "\${LISTEN_FDS:-}" ]; then
  ino=\$(readlink /proc/\$\$/fd/3); ino=\${ino#socket:[}; ino=\${ino%]}
  echo "\$\$ \$(awk -v i="\$ino" '\$7 == i { print \$8 }' /proc/net/unix)" \
    >> "$tmp/helpers"
fi
exec "$real" "\$@"
SCRIPT
chmod +x "$tmp/bin/nbdkit"

mkdir "$tmp/web"
qemu-img create -q -f raw "$tmp/web/base.raw" 16M
QIO_FMT=raw qio "$tmp/web/base.raw" 'write -P 0x11 0 16M'
# Slow answers: reads overlap, and more connections (helpers) are made.
RANGE_SERVER_DELAY=0.2 http_server "$tmp/web"
ovl=$tmp/ovl.qcow2
qemu-img create -q -f qcow2 -b "http://127.0.0.1:$http_port/base.raw" \
  -F raw "$ovl"

reads='
bufs = [nbd.Buffer(65536) for i in range(16)]
for i, b in enumerate(bufs):
    h.aio_pread(b, i << 20)
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(b.to_bytearray() == bytearray([0x11]) * 65536 for b in bufs)
'

# helpers_gone WHAT: every helper noted has exited and its folder is
# gone, within 10 s.
helpers_gone ()
{
  local i pid sock left
  [ "$(wc -l < "$tmp/helpers")" -ge 2 ] ||
    fail "$1: fewer helpers than expected: $(cat "$tmp/helpers")"
  for i in $(seq 100); do
    left=
    while read -r pid sock; do
      [ -n "$sock" ] || fail "$1: helper $pid: its socket not found"
      if kill -0 "$pid" 2>/dev/null; then
        left+=" helper $pid ($(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" || true))"
      fi
      if [ -e "${sock%/sock}" ]; then left+=" folder ${sock%/sock}"; fi
    done < "$tmp/helpers"
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  fail "$1: left behind:$left"
}

# Forked into the background, then killed.
rm -f "$tmp/helpers"
PATH=$tmp/bin:$PATH nbd_server q qcow2 "$ovl"
nbdsh -u "nbd+unix:///?socket=$tmp/q.sock" -c "$reads" ||
  fail "reads over the web server"
# A helper's folder goes once it is connected; one still connecting
# when SIGKILL lands keeps it (nothing of ours runs after SIGKILL), so
# wait for the connections the reads started, then kill.
for i in $(seq 100); do
  left=
  while read -r pid sock; do
    [ ! -e "${sock%/sock}" ] || left+=" ${sock%/sock}"
  done < "$tmp/helpers"
  [ -n "$left" ] || break
  sleep 0.1
done
[ -z "$left" ] || fail "folders not removed once connected:$left"
kill -9 "$(cat "$tmp/q.pid")"
helpers_gone "SIGKILL"

# --run.
rm -f "$tmp/helpers"
PATH=$tmp/bin:$PATH nbdkit -U - qcow2 "$ovl" --run "nbdsh -u \"\$uri\" -c '$reads'" ||
  fail "reads over the web server with --run"
helpers_gone "--run"

# No nbdkit in PATH for the helper (the wrapper runs nbdkit by its path).
# Every command of /usr/bin but nbdkit (the wrapper needs some).
mkdir "$tmp/empty"
for f in /usr/bin/*; do
  [ "${f##*/}" = nbdkit ] || ln -s "$f" "$tmp/empty/"
done
! PATH=$tmp/empty /bin/bash "$(type -P nbdkit)" -U "$tmp/r.sock" qcow2 "$ovl" \
  2> "$tmp/nopath.err" || fail "nbdkit started without a helper"
grep -q "nbdkit's curl plugin could not be started: nbdkit not found in PATH" \
  "$tmp/nopath.err" || fail "no helper, said otherwise: $(cat "$tmp/nopath.err")"
