#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over nbdkit's ssh plugin, against an sshd of our own
# on the loopback address (a throwaway host key and user key, started
# and stopped here): the image read as qemu-img reads it, written
# (through the plugin's one-request-at-a-time model), and then clean.
source "${srcdir:-.}/functions.sh"
set -e
requires ssh-keygen /usr/sbin/sshd
requires_nbdkit_plugin ssh
source "${srcdir:-.}/filter-qcow2-image.sh"
source "${srcdir:-.}/remote-functions.sh"
start_sshd

ssh=(ssh host=127.0.0.1 port="$ssh_port" user="$(id -un)" identity="$tmp/user_key"
     known-hosts="$tmp/known_hosts")
cp "$img" "$tmp/dir/w.qcow2"
truncate -s +8M "$tmp/dir/w.qcow2"
read_as ssh --filter=qcow2 "${ssh[@]}" path="$tmp/dir/w.qcow2" backing-dir="$tmp/dir" ||
  fail "over ssh: $(cat "$tmp/sshd.log")"
cmp "$tmp/want.raw" "$tmp/ssh.raw" || fail "read over the ssh plugin"
nbdkit -U - --filter=qcow2 "${ssh[@]}" path="$tmp/dir/w.qcow2" backing-dir="$tmp/dir" \
  --run 'nbdcopy --requests=16 "'"$tmp"'/want.raw" "$uri" &&
         nbdsh -u "$uri" -c "
h.pwrite(b\"\\x5b\" * 70001, (7 << 20) + 11)
h.flush()
"' || fail "writes over the ssh plugin"
qemu-img check -q "$tmp/dir/w.qcow2" || fail "qemu-img check after writes over ssh"
/usr/bin/python3 - "$tmp/want.raw" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek((7 << 20) + 11)
    f.write(b"\x5b" * 70001)
PY
qemu-img compare -q -f qcow2 -F raw "$tmp/dir/w.qcow2" "$tmp/want.raw" ||
  fail "the image written over ssh holds other data"
