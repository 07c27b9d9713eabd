#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET's socket: made with mode 0600, its path made absolute
# (nbdkit in the background works in /); a stale socket (a server
# gone) replaced, a live one, a file, a folder and a symbolic link
# refused (nbdkit exits 1, naming it, and leaves it as it was); removed
# at exit however nbdkit ran: in the foreground, forked into the
# background, with --run, socket-activated, and when nbdkit fails after
# making it; left alone if another file took its path meanwhile.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

img="$tmp/disk.qcow2"
qemu-img create -q -f qcow2 "$img" 16M
# The image is served again and again: its lock never in the way.
serve=(qcow2 "$img" locking=off)

qmp_version ()
{
  /usr/bin/python3 "$srcdir/qmpclient.py" "$1" query-version
}

# Foreground: mode 0600; answers; removed at exit.
control_serve fg "${serve[@]}"
[ "$(stat -c %a "$tmp/fg.qmp")" = 600 ] ||
  fail "mode $(stat -c %a "$tmp/fg.qmp"), not 600"
qmp_version "$tmp/fg.qmp" | grep -q '"package": "nbdkit-qcow2 ' ||
  fail "query-version over control="

# A live socket, a file, a folder, a link: refused, left as they were.
expect_refused "control=$tmp/fg.qmp: another server listens on it" \
  "${serve[@]}" control="$tmp/fg.qmp"
qmp_version "$tmp/fg.qmp" > /dev/null || fail "the live server after the refusal"
echo data > "$tmp/file"
expect_refused "control=$tmp/file: exists and is not a socket" \
  "${serve[@]}" control="$tmp/file"
[ "$(cat "$tmp/file")" = data ] || fail "the file changed"
mkdir "$tmp/folder"
expect_refused "control=$tmp/folder: exists and is not a socket" \
  "${serve[@]}" control="$tmp/folder"
ln -s "$tmp/fg.qmp" "$tmp/link"
expect_refused "control=$tmp/link: exists and is not a socket" \
  "${serve[@]}" control="$tmp/link"
[ -L "$tmp/link" ] || fail "the link was removed"
expect_refused "control=.*: too long for a socket's path" \
  "${serve[@]}" control="$tmp/$(printf 'a%.0s' $(seq 120))"
grep -q "hint: name a shorter path" "$tmp/refused.err" || fail "no hint"
stop_server fg
wait_gone "$tmp/fg.qmp" || fail "foreground: the socket stayed after exit"

# A stale socket (its server killed: nothing removed it) is replaced.
control_serve stale "${serve[@]}"
kill -9 "$(cat "$tmp/stale.pid")"
for i in $(seq 50); do kill -0 "$(cat "$tmp/stale.pid")" 2>/dev/null || break; sleep 0.1; done
[ -S "$tmp/stale.qmp" ] || fail "SIGKILL left no socket"
control_serve stale "${serve[@]}"
qmp_version "$tmp/stale.qmp" > /dev/null || fail "the stale socket not replaced"
[ "$(stat -c %a "$tmp/stale.qmp")" = 600 ] || fail "replaced, not mode 600"

# Another file took its path: not removed at exit.
rm "$tmp/stale.qmp"
echo other > "$tmp/stale.qmp"
stop_server stale
[ "$(cat "$tmp/stale.qmp")" = other ] || fail "another's file removed at exit"

# Forked into the background, control= relative: the parent's exit
# removes nothing, the daemon (in /) answers on the path given.
(cd "$tmp" && nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" "${serve[@]}" \
   control=bg.qmp) || fail "nbdkit in the background did not start"
wait_socket "$tmp/bg.sock" "$(cat "$tmp/bg.pid")" || fail "bg: no NBD socket"
servers+=("$(cat "$tmp/bg.pid")")
sleep 0.5
[ -S "$tmp/bg.qmp" ] || fail "forked: the socket is gone"
qmp_version "$tmp/bg.qmp" > /dev/null || fail "forked: no answer"
stop_server bg
wait_gone "$tmp/bg.qmp" || fail "forked: the socket stayed after exit"

# --run: the command drives it; removed when nbdkit exits.
nbdkit -U - "${serve[@]}" control="$tmp/run.qmp" --run "
  /usr/bin/python3 '$srcdir/qmpclient.py' '$tmp/run.qmp' query-commands
" > "$tmp/run.out" || fail "--run"
grep -q '"name": "query-version"' "$tmp/run.out" || fail "--run: $(cat "$tmp/run.out")"
[ ! -e "$tmp/run.qmp" ] || fail "--run: the socket stayed after exit"

# nbdkit fails after get_ready (its own socket taken): not left behind.
control_serve taken "${serve[@]}"
r=0
nbdkit -f -U "$tmp/taken.sock" "${serve[@]}" control="$tmp/late.qmp" \
  2> "$tmp/late.err" || r=$?
[ "$r" = 1 ] || fail "nbdkit on a socket taken: exit $r"
[ ! -e "$tmp/late.qmp" ] || fail "failed at start: the socket stayed"
stop_server taken

# Socket activation (systemd's tool, as a unit would start it).
if type -P systemd-socket-activate > /dev/null; then
  systemd-socket-activate -l "$tmp/act.sock" \
    nbdkit "${serve[@]}" control="$tmp/act.qmp" 2> "$tmp/act.log" &
  act=$!
  servers+=("$act")
  disown "$act"
  wait_socket "$tmp/act.sock" "$act" || fail "socket activation did not listen"
  nbdinfo --size "nbd+unix:///?socket=$tmp/act.sock" > /dev/null ||
    { cat "$tmp/act.log"; fail "socket activation: NBD"; }
  wait_socket "$tmp/act.qmp" "$act" || fail "socket activation: no control socket"
  qmp_version "$tmp/act.qmp" > /dev/null || fail "socket activation: no answer"
  kill "$act"
  wait_gone "$tmp/act.qmp" || fail "socket activation: the socket stayed after exit"
else
  echo "$0: socket activation not tested: no systemd-socket-activate (Debian's systemd)"
fi
