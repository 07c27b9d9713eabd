#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An image cut short of its data (truncate -s), served read-write:
# reads never write.  What lies past the end of the file reads as QEMU
# reads it (zeros: data clusters, and the span of an L2 table cut
# off), block status as qemu-img map says, nothing is said, and the
# file is left byte for byte as it was: no corrupt mark, qemu-img
# check and info say what they said before.  The same through the
# qcow2 filter over the file plugin.
source "${srcdir:-.}/bad-functions.sh"
requires nbdcopy cmp

# 4 KiB clusters (an L2 table maps 2 MiB): 0x11 at 0, and 0x22 at 4M,
# whose L2 table comes after the first data in the file.
img=$tmp/cut.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 8M
qio "$img" "write -P 0x11 0 256k" "write -P 0x22 4M 256k"
read -r e _ < <(qpatch "$img" l2-entry 128k)
read -r l1e _ < <(qpatch "$img" l1-entry 2)
host=$(( e & 0xfffffffffffe00 )) l2=$(( l1e & 0xfffffffffffe00 ))
[ "$l2" -gt "$host" ] || fail "unexpected layout: L2 table of 4M before data"
# Cut mid-cluster: guest 128k+2k on are past the end, and so is the L2
# table of 4M-6M.
truncate -s $(( host + 2048 )) "$img"
cp "$img" "$tmp/before.qcow2"
r=0; qemu-img check "$img" > "$tmp/check.before" 2>&1 || r=$?
[ "$r" -ne 0 ] || fail "qemu-img check finds nothing wrong with a cut image"

# QEMU's reading, the oracle: zeros past the cut.
qemu-img convert -f qcow2 -O raw "$img" "$tmp/qemu.raw"
/usr/bin/python3 - "$tmp/qemu.raw" <<'EOF' || fail "QEMU reads the cut image otherwise"
import sys
d = open(sys.argv[1], "rb").read()
cut = 128 * 1024 + 2048
assert d[:cut] == b"\x11" * cut
assert d[cut:] == bytes(len(d) - cut)
EOF
cmp "$img" "$tmp/before.qcow2" || fail "qemu-img convert changed the file"

# Requests across the cut and in the missing parts, read-write; what
# nbdkit says.
export BAD_PRELUDE QEMU_RAW=$tmp/qemu.raw
timeout 60 nbdkit -U - qcow2 "$img" --run '
  nbdsh --base-allocation -u "$uri" -c "$BAD_PRELUDE" -c "
import os
assert not h.is_read_only()
ref = open(os.environ[\"QEMU_RAW\"], \"rb\").read()
for off, n in ((128 << 10, 4096), ((128 << 10) + 2000, 100), (0, 1 << 20),
               (4 << 20, 256 << 10), ((4 << 20) - 512, 1024), (0, 8 << 20)):
    assert h.pread(n, off) == ref[off:off + n], (off, n)
h.block_status(8 << 20, 0, lambda *args: 0)
h.flush()
"' > "$tmp/log" 2>&1 || { cat "$tmp/log"; fail "serving $img"; }
sed 's/^/    /' "$tmp/log"
! grep -q "error" "$tmp/log" || fail "reads of a cut image said an error"

# The whole disk and its map against QEMU's, by the plugin and the
# filter (each serves it read-write).
check_image "$img"
qemu_src=(-f qcow2 "$img")
_check_served "$img" --filter=qcow2 file "$img"

# The file as it was: no mark, qemu-img says what it said.
cmp "$img" "$tmp/before.qcow2" || fail "reads changed the file"
qemu-img info "$img" | grep -q "corrupt: false" || fail "marked corrupt"
r2=0; qemu-img check "$img" > "$tmp/check.after" 2>&1 || r2=$?
[ "$r2" -eq "$r" ] || fail "qemu-img check: exit status $r2, was $r"
diff -u "$tmp/check.before" "$tmp/check.after" ||
  fail "qemu-img check says otherwise after the reads"
echo "cut image read as QEMU reads it, nothing written: OK"
