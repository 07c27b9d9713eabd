# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the test-filter-qcow2-*.sh tests, after functions.sh: an
# overlay $img over a backing file $base in $tmp/dir, with data, zeroes
# and a compressed cluster, and a snapshot s1 taken before the last
# write; $tmp/want.raw and $tmp/want-s1.raw what they read as (qemu-img).
# read_as NAME NBDKIT-ARGS...: the disk read through them into
# $tmp/NAME.raw, and their block status into $tmp/NAME.map.
requires qemu-img qemu-io nbdcopy nbdinfo nbdsh cmp
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

read_as ()
{
  local name="$1"; shift
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - "$@" --run \
    "nbdcopy \"\$uri\" '$tmp/$name.raw' && nbdinfo --map \"\$uri\" > '$tmp/$name.map'" ||
    fail "nbdkit $*"
}
