#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay over the memory plugin, QEMU the oracle:
# writes against a model kept in FILE across restarts (the plugin's
# disk is new and empty each time); NBD cache requests fill FILE (zeros
# as zero clusters); FILE passes qemu-img check.  Over other plugins:
# test-overlay-curl.sh, test-overlay-curl-qemu.sh, test-overlay-xz.sh.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"
size=$((8 << 20))

ov=$tmp/mem.qcow2
truncate -s "$size" "$tmp/mem.model"
for seed in 1 2; do
  nbdkit -U - --filter=qcow2 memory "$size" qcow2-overlay="$ov" --run '
    /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/mem.model"' '"$seed"' 40' ||
    fail "memory: writes (round $seed)"
done
check_overlay "$ov" || fail "memory: qemu-img check"
nbdkit -U - --filter=qcow2 memory "$size" qcow2-overlay="$ov" \
  qcow2-overlay-on-read=true --run '
  nbdsh -u "$uri" -c "
assert h.can_cache()
h.cache(h.get_size(), 0)
" && nbdcopy "$uri" '"$tmp/mem.out"'' || fail "memory: cache request"
cmp "$tmp/mem.out" "$tmp/mem.model" || fail "memory: read back after restarts"
check_overlay "$ov" || fail "memory: qemu-img check after the cache request"
# Filled whole, FILE holds every cluster (zeros as zero clusters):
# detached from the plugin as the man page says, QEMU reads it alone.
qemu-img rebase -u -b "" "$ov"
qemu-img map --output=json -f qcow2 "$ov" | grep -q '"present": false' &&
  fail "memory: the cache request left clusters unfilled"
qemu-img compare -f qcow2 -F raw "$ov" "$tmp/mem.model" ||
  fail "memory: FILE alone differs"
