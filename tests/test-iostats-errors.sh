#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats counts failed requests by errno, apart from those that
# succeeded: errors injected below it by nbdkit's error filter, fast
# zeroes refused (ENOTSUP) by nbdkit's nozero filter and by the qcow2
# plugin itself (a partial cluster over a backing file).
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img qemu-io

# 3 writes succeed, 2 fail with EIO (while the inject file exists),
# 1 succeeds; both trims fail with ENOSPC; reads are untouched.
export inject=$tmp/inject
workload='
import errno, os
def expect(e, f, *args):
    try:
        f(*args)
    except nbd.Error as ex:
        assert ex.errnum == e, ex
    else:
        raise AssertionError("%s%r succeeded" % (f.__name__, args))
for i in range(3):
    h.pwrite(b"\x02" * 4096, i * 4096)
open(os.environ["inject"], "w").close()
expect(errno.EIO, h.pwrite, b"\x03" * 4096, 65536)
expect(errno.EIO, h.pwrite, b"\x03" * 4096, 69632)
os.unlink(os.environ["inject"])
h.pwrite(b"\x04" * 8192, 131072)
expect(errno.ENOSPC, h.trim, 65536, 0)
expect(errno.ENOSPC, h.trim, 65536, 65536)
h.pread(4096, 0)
h.flush()
'
export workload

# check_errors NAME: the JSON report of the workload.
check_errors ()
{
  /usr/bin/python3 - "$tmp/$1.json" <<'EOF' || fail "$1: errors not counted"
import json, sys
r = json.loads(open(sys.argv[1]).read())
print(json.dumps(r["ops"]["write"]), json.dumps(r["ops"]["trim"]))
w, t, rd = r["ops"]["write"], r["ops"]["trim"], r["ops"]["read"]
assert (w["count"], w["bytes"], w["errors"]) == (4, 20480, {"EIO": 2}), w
assert (t["count"], t["bytes"], t["errors"]) == (0, 0, {"ENOSPC": 2}), t
assert t["p50_s"] == t["max_s"] == 0, t
assert (rd["count"], rd["errors"]) == (1, {}), rd
EOF
}

for plugin in memory qcow2; do
  if [ $plugin = memory ]; then
    args=(memory 1M)
  else
    img=$tmp/disk.qcow2
    qemu-img create -q -f qcow2 "$img" 1M
    args=(qcow2 "file=$img")
  fi
  timeout -k 10 60 nbdkit -U - --filter=iostats --filter=error "${args[@]}" \
    error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$inject" \
    error-trim=ENOSPC error-trim-rate=100% \
    iostats-file="$tmp/$plugin.json" iostats-format=json \
    --run 'nbdsh -u "$uri" -c "$workload"' 2> "$tmp/err" || {
      cat "$tmp/err"
      fail "$plugin: the error workload failed"
    }
  check_errors $plugin
  # The same in text.
  timeout -k 10 60 nbdkit -U - --filter=iostats --filter=error "${args[@]}" \
    error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$inject" \
    error-trim=ENOSPC error-trim-rate=100% \
    iostats-file="$tmp/$plugin.txt" \
    --run 'nbdsh -u "$uri" -c "$workload"' 2> "$tmp/err" ||
    fail "$plugin: the error workload failed (text)"
  cat "$tmp/$plugin.txt"
  grep -A3 '^write: 4 ops, [0-9.]* s, 20480 bytes' "$tmp/$plugin.txt" |
    grep -qx '  errors: EIO 2' || fail "$plugin: text: write errors"
  grep -A3 '^trim: 0 ops, 0.000000 s, 0 bytes' "$tmp/$plugin.txt" |
    grep -qx '  errors: ENOSPC 2' || fail "$plugin: text: trim errors"
done
qemu-img check -q "$img" || fail "qemu-img check $img"

# Fast zeroes refused by the nozero filter below: 3 fast zeroes fail
# with ENOTSUP, 2 slow ones succeed.
zeroes='
import errno
for i in range(3):
    try:
        h.zero(65536, i * 65536, nbd.CMD_FLAG_FAST_ZERO)
        raise AssertionError("fast zero succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.ENOTSUP, e
h.zero(65536, 0)
h.zero(4096, 65536)
'
export zeroes
timeout -k 10 60 nbdkit -U - --filter=iostats --filter=nozero memory 1M \
  zeromode=plugin fastzeromode=slow \
  iostats-file="$tmp/nozero.json" iostats-format=json \
  --run 'nbdsh -u "$uri" -c "$zeroes"' || fail "the nozero workload failed"
/usr/bin/python3 - "$tmp/nozero.json" <<'EOF' || fail "nozero: fast zeroes not counted"
import json, sys
z = json.loads(open(sys.argv[1]).read())["ops"]["zero"]
print(json.dumps(z))
assert (z["count"], z["bytes"]) == (2, 69632), z
assert z["errors"] == {"ENOTSUP": 3}, z
assert z["fast"] == {"ok": 0, "ENOTSUP": 3}, z
assert z["slow"] == {"ok": 2, "ENOTSUP": 0}, z
EOF

# The qcow2 plugin refuses a fast zero of a partial cluster over backing
# data, and zeroes whole clusters fast.
base=$tmp/base.qcow2 img=$tmp/overlay.qcow2
qemu-img create -q -f qcow2 "$base" 1M
qio "$base" 'write -P 7 0 1M'
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img" 1M
zeroes='
import errno
h.zero(131072, 0, nbd.CMD_FLAG_FAST_ZERO)
try:
    h.zero(1000, 262244, nbd.CMD_FLAG_FAST_ZERO)
    raise AssertionError("partial fast zero over backing data succeeded")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
h.zero(1000, 262244)
h.flush()
'
timeout -k 10 60 nbdkit -U - --filter=iostats qcow2 "file=$img" \
  iostats-file="$tmp/qcow2-zero.txt" \
  --run 'nbdsh -u "$uri" -c "$zeroes"' || fail "the qcow2 zero workload failed"
cat "$tmp/qcow2-zero.txt"
grep -A5 '^zero: 2 ops, [0-9.]* s, 132072 bytes' "$tmp/qcow2-zero.txt" > "$tmp/zero"
grep -qx '  errors: ENOTSUP 1' "$tmp/zero" || fail "qcow2: zero errors"
grep -qx '  fast: 1 ok, ENOTSUP 1' "$tmp/zero" || fail "qcow2: fast zeroes"
grep -qx '  slow: 1 ok' "$tmp/zero" || fail "qcow2: slow zeroes"
qemu-img check -q "$img" || fail "qemu-img check $img"
qio "$img" 'read -P 0 0 128k' 'read -P 7 128k 100' 'read -P 0 262244 1000' \
  'read -P 7 263244 1000'
