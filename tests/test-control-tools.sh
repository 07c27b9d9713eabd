#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET driven by the tools an admin has at hand, unchanged:
# socat (lines in, lines out: the input's end is an end, and the replies
# still come), and QEMU's qmp-shell where it is installed (QEMU's
# python/qemu/qmp: not packaged in Debian 12, so here it is not).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img socat
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

qemu-img create -q -f qcow2 "$tmp/disk.qcow2" 16M
control_serve srv qcow2 "$tmp/disk.qcow2"

# Each line the server writes: one JSON object, CRLF at its end.
check_lines ()
{
  /usr/bin/python3 -c '
import json, sys
lines = sys.stdin.buffer.read().split(b"\n")
assert lines[-1] == b"", lines[-1]
for l in lines[:-1]:
    assert l.endswith(b"\r"), l
    print(json.dumps(json.loads(l), sort_keys=True))
'
}

printf '%s\n' '{"execute": "qmp_capabilities"}' \
  '{"execute": "query-commands", "id": 1}' \
  '{"execute": "query-version", "id": "v"}' |
  timeout 20 socat -t 5 - UNIX-CONNECT:"$tmp/srv.qmp" > "$tmp/socat.out" ||
  fail "socat"
check_lines < "$tmp/socat.out" > "$tmp/socat.json" ||
  fail "socat: not QMP's lines: $(cat "$tmp/socat.out")"
[ "$(wc -l < "$tmp/socat.json")" = 4 ] || fail "socat: $(cat "$tmp/socat.json")"
sed -n 1p "$tmp/socat.json" | grep -q '^{"QMP": {"capabilities": \[\], "version": ' ||
  fail "socat: the greeting: $(sed -n 1p "$tmp/socat.json")"
sed -n 2p "$tmp/socat.json" | grep -qx '{"return": {}}' ||
  fail "socat: negotiation: $(sed -n 2p "$tmp/socat.json")"
sed -n 3p "$tmp/socat.json" | grep -q '"id": 1, "return": \[{"name": "qmp_capabilities"}' ||
  fail "socat: query-commands: $(sed -n 3p "$tmp/socat.json")"
sed -n 4p "$tmp/socat.json" | grep -q '"id": "v", "return": {"package": "nbdkit-qcow2 ' ||
  fail "socat: query-version: $(sed -n 4p "$tmp/socat.json")"

# A typo, as typed at a terminal: QEMU's error, and the session goes on.
printf '%s\n' '{"execute": "qmp_capabilities"}' '{"execute": "query-versoin"}' \
  '{"execute": "query-version" ' '}' |
  timeout 20 socat -t 5 - UNIX-CONNECT:"$tmp/srv.qmp" | check_lines > "$tmp/typo.json" ||
  fail "socat: a typo"
grep -qx '{"error": {"class": "CommandNotFound", "desc": "The command query-versoin has not been found"}}' \
  "$tmp/typo.json" || fail "socat: the typo's error: $(cat "$tmp/typo.json")"
[ "$(grep -c '"return": {"package"' "$tmp/typo.json")" = 1 ] ||
  fail "socat: a message over two lines: $(cat "$tmp/typo.json")"

if type -P qmp-shell > /dev/null; then
  echo query-version | timeout 20 qmp-shell "$tmp/srv.qmp" > "$tmp/shell.out" 2>&1 ||
    fail "qmp-shell: $(cat "$tmp/shell.out")"
  grep -q "nbdkit-qcow2" "$tmp/shell.out" || fail "qmp-shell: $(cat "$tmp/shell.out")"
else
  echo "$0: qmp-shell not tested: not installed (QEMU's python/qemu/qmp is not in Debian 12)"
fi
stop_server srv
