#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over other plugins: nbdkit's file plugin (reads and
# block status byte-identical to the qcow2 plugin's; writes where the
# file has room, then qemu-img check and qemu-io), the data plugin (an
# image in memory, written), the nbd plugin forwarding to a second
# nbdkit (a remote image), the xz filter (a .qcow2.xz read in place), a
# local HTTP server with range requests through the curl plugin, and
# stacked among nbdkit's filters and ours; backing files through
# backing-dir=, backing=none, snapshots; read-only when nbdkit is.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdinfo nbdsh cmp
here=$(cd "${srcdir:-.}" && pwd)

# An overlay over a backing file, with data, zeroes and a compressed
# cluster, and a snapshot taken before the last write.
mkdir "$tmp/dir"
base=$tmp/dir/base.qcow2
img=$tmp/dir/top.qcow2
qemu-img create -q -f qcow2 "$base" 8M
qemu-io -f qcow2 -c 'write -P 0x11 0 2M' "$base" >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$img"
qemu-io -f qcow2 -c 'write -P 0x22 1M 64k' -c 'write -z 3M 64k' \
  -c 'write -c -P 0x33 4M 64k' "$img" >/dev/null
qemu-img snapshot -c s1 "$img"
qemu-io -f qcow2 -c 'write -P 0x44 5M 4k' "$img" >/dev/null
qemu-img convert -f qcow2 -O raw "$img" "$tmp/want.raw"
qemu-img convert -f qcow2 -O raw -l s1 "$img" "$tmp/want-s1.raw"

# read_as NAME NBDKIT-ARGS...: the disk read through them into NAME.raw,
# and their block status into NAME.map.
read_as ()
{
  local name="$1"; shift
  timeout 120 nbdkit -U - "$@" --run \
    "nbdcopy \"\$uri\" '$tmp/$name.raw' && nbdinfo --map \"\$uri\" > '$tmp/$name.map'" ||
    fail "nbdkit $*"
}

# Over the file plugin, as the plugin form reads it.
cd "$tmp/dir"
read_as plugin qcow2 "$img"
read_as filter --filter=qcow2 file "$img"
cmp "$tmp/want.raw" "$tmp/plugin.raw" || fail "the plugin form reads wrong"
cmp "$tmp/plugin.raw" "$tmp/filter.raw" || fail "the filter reads differently from the plugin"
cmp "$tmp/plugin.map" "$tmp/filter.map" || fail "the filter's block status differs from the plugin's"
cd "$tmp"

# backing-dir= from elsewhere; backing=none; a snapshot.
read_as bdir --filter=qcow2 file "$img" backing-dir="$tmp/dir"
cmp "$tmp/want.raw" "$tmp/bdir.raw" || fail "backing-dir="
# A missing backing file: said at start, and every connection refused
# (nbdkit may have started the client already: it must not hang).
rc=0
timeout 60 nbdkit -U - --filter=qcow2 file "$img" --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/missing.log" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a missing backing file: exit status $rc"
grep -q 'cannot open backing file "base.qcow2"' "$tmp/missing.log" ||
  fail "no message about the missing backing file: $(cat "$tmp/missing.log")"
read_as alone --filter=qcow2 file "$img" backing=none
qemu-img convert -f qcow2 -O raw "$base" "$tmp/base.raw"
cmp -s "$tmp/alone.raw" "$tmp/want.raw" && fail "backing=none read the backing file"
cmp -n 1M "$tmp/alone.raw" /dev/zero || fail "backing=none: the backing file's data showed"
read_as snap --filter=qcow2 file "$img" backing-dir="$tmp/dir" snapshot=s1
cmp "$tmp/want-s1.raw" "$tmp/snap.raw" || fail "snapshot= through the filter"

# Writes: refused for want of room (the plugin's export cannot grow),
# then done once the file has some; qemu-img check and qemu-io agree.
cp "$img" "$tmp/dir/full.qcow2"
cp "$img" "$tmp/dir/w.qcow2"
nbdkit -U - --filter=qcow2 file "$tmp/dir/full.qcow2" backing-dir="$tmp/dir" \
  --run 'nbdsh -u "$uri" -c "
import errno
try:
    h.pwrite(b\"x\" * 4096, 6 << 20)
    raise AssertionError(\"a write past the file succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
"' 2> "$tmp/nospace.log" || { cat "$tmp/nospace.log"; fail "ENOSPC case"; }
grep -q "No space left on device" "$tmp/nospace.log" || fail "no message for ENOSPC"
rc=0
(cd "$tmp/dir" && qemu-img check -q "$tmp/dir/full.qcow2") || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || fail "qemu-img check after ENOSPC: $rc"
truncate -s +16M "$tmp/dir/w.qcow2"
nbdkit -U - --filter=qcow2 file "$tmp/dir/w.qcow2" backing-dir="$tmp/dir" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x55\" * 70000, 6 << 20)
h.zero(65536, 1 << 20)
h.trim(65536, 4 << 20)
h.pwrite(b\"\\x66\" * 512, 3, nbd.CMD_FLAG_FUA)
h.flush()
"' || fail "writes through the filter"
qemu-img check -q "$tmp/dir/w.qcow2" || fail "qemu-img check after writes through the filter"
(cd "$tmp/dir" &&
 qemu-io -f qcow2 -c 'read -P 0x55 6M 70000' -c 'read -P 0 1M 64k' \
   -c 'read -P 0 4M 64k' -c 'read -P 0x66 3 512' -c 'read -P 0x11 0 3' \
   -c 'read -P 0x44 5M 4k' "$tmp/dir/w.qcow2" > "$tmp/qio.log") ||
  { cat "$tmp/qio.log"; fail "qemu-io reads other data than was written"; }

# nbdkit -r: read-only.
nbdkit -r -U - --filter=qcow2 file "$img" backing-dir="$tmp/dir" \
  --run 'nbdsh -u "$uri" -c "assert h.is_read_only()"' ||
  fail "nbdkit -r: the filter serves read-write"

# The data plugin: an image in memory, written there.
qemu-img create -q -f qcow2 "$tmp/small.qcow2" 4M
truncate -s 2M "$tmp/small.qcow2"
nbdkit -U - --filter=qcow2 data "<$tmp/small.qcow2" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x77\" * 8192, 1 << 20)
h.flush()
assert h.pread(8192, 1 << 20) == b\"\\x77\" * 8192
assert h.pread(4096, 0) == bytes(4096)
"' || fail "the data plugin"

# The nbd plugin, forwarding to a second nbdkit serving the raw bytes.
sock=$tmp/raw.sock
nbdkit -U "$sock" -P "$tmp/raw.pid" file "$img"
for i in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
read_as remote --filter=qcow2 nbd socket="$sock" backing-dir="$tmp/dir"
kill "$(cat "$tmp/raw.pid")"
cmp "$tmp/want.raw" "$tmp/remote.raw" || fail "over the nbd plugin"

# A .qcow2.xz read in place (read-only).
if command -v xz >/dev/null; then
  qemu-img convert -O qcow2 "$img" "$tmp/flat.qcow2"
  xz -k --block-size=1M "$tmp/flat.qcow2"
  read_as xz -r --filter=qcow2 --filter=xz file "$tmp/flat.qcow2.xz"
  cmp "$tmp/want.raw" "$tmp/xz.raw" || fail "under the xz filter"
fi

# A local HTTP server that answers range requests, through curl.
if nbdkit curl --version >/dev/null 2>&1 && /usr/bin/python3 -c 'import http.server'; then
  port_file=$tmp/http.port
  /usr/bin/python3 "$here/range-server.py" "$tmp/dir" "$port_file" &
  http=$!
  for i in $(seq 50); do [ -s "$port_file" ] && break; sleep 0.1; done
  read_as http -r --filter=qcow2 curl "http://127.0.0.1:$(cat "$port_file")/top.qcow2" \
    backing-dir="$tmp/dir"
  kill "$http"
  cmp "$tmp/want.raw" "$tmp/http.raw" || fail "over HTTP (curl plugin)"
fi

# Stacked: nbdkit's cow filter above (writes kept in memory), our
# iostats above and latency below the qcow2 filter.
nbdkit -U - --filter=cow --filter=iostats --filter=qcow2 --filter=latency \
  file "$img" backing-dir="$tmp/dir" latency-read=1ms iostats-file="$tmp/st" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x99\" * 512, 0)
assert h.pread(512, 0) == b\"\\x99\" * 512
assert h.pread(64 * 1024, 1 << 20) == b\"\\x22\" * 65536
"' || fail "stacked among other filters"
grep -q "read" "$tmp/st" || fail "iostats above the filter counted nothing"
qemu-img convert -f qcow2 -O raw "$img" "$tmp/after.raw"
cmp "$tmp/want.raw" "$tmp/after.raw" ||
  fail "the cow filter above let a write reach the image"
