#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# L2 cache options: the same images read identically with the default
# cache, with a cache too small for the disk (forcing evictions) and with
# every L2 slice size from 512 bytes to the cluster size; bad values are
# refused with an error naming the option; -D qcow2.cache=1 logs the
# cache's work.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

# 4k clusters: one L2 table maps 2 MiB, so 64 MiB needs 32 tables
# (128 KiB of L2); writes in every MiB, in a scattered order.
img4k=$tmp/c4k.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img4k" 64M
cmds=()
for i in $(seq 0 63); do
  cmds+=("write -P $((i + 1)) $(( (i * 29 % 64) * 1048576 + i * 1000 + 1 )) 5000")
done
qio "$img4k" "${cmds[@]}"

# 64k clusters, 80 MiB: a 512-byte slice maps 4 MiB, so the 10 KiB of
# L2 table in use are 20 slices (a 4K cache holds 8), and 3 of the
# 4 KiB slices that l2-cache-size=1 holds 2 of.
img64k=$tmp/c64k.qcow2
qemu-img create -q -f qcow2 "$img64k" 80M
cmds=()
for i in $(seq 0 39); do
  cmds+=("write -P $((i + 101)) $(( (i * 17 % 40) * 2 * 1048576 + i * 777 )) 70000")
done
qio "$img64k" "${cmds[@]}"

for opts in "" "l2-cache-size=64K" "l2-cache-size=64K l2-slice-size=512" \
            "l2-slice-size=512" "l2-slice-size=1k" "l2-slice-size=4k" \
            "l2-cache-size=8k l2-slice-size=4096" "l2-cache-size=1" \
            "l2-cache-size=1G"; do
  check_image "$img4k" $opts
done
for opts in "" "l2-cache-size=4K l2-slice-size=512" \
            "l2-cache-size=64K l2-slice-size=512" "l2-slice-size=4k" \
            "l2-slice-size=64k" "l2-cache-size=64k" "l2-cache-size=1" \
            "l2-cache-entry-size=1k"; do
  check_image "$img64k" $opts
done

# l2-cache-entry-size is QEMU's name for the slice size.
nbdkit -v -U - qcow2 "file=$img64k" l2-cache-entry-size=1k l2-cache-size=64k \
  --run true 2> "$tmp/alias.log" || fail "l2-cache-entry-size=1k"
grep -q 'L2 cache 64 slices of 1024 bytes' "$tmp/alias.log" ||
  fail "l2-cache-entry-size=1k: $(grep 'L2 cache' "$tmp/alias.log")"

# Bad values: nbdkit refuses to start and says which option is wrong.
expect_refused 'l2-slice-size' qcow2 "file=$img64k" l2-slice-size=3000
expect_refused 'l2-slice-size' qcow2 "file=$img64k" l2-slice-size=128k
expect_refused 'l2-slice-size' qcow2 "file=$img4k" l2-slice-size=8k
expect_refused 'l2-slice-size' qcow2 "file=$img64k" l2-slice-size=256
expect_refused 'l2-slice-size' qcow2 "file=$img64k" l2-slice-size=0
expect_refused 'l2-cache-entry-size' qcow2 "file=$img64k" l2-cache-entry-size=3000
expect_refused 'l2-cache-size' qcow2 "file=$img64k" l2-cache-size=0
expect_refused 'size|foo' qcow2 "file=$img64k" l2-cache-size=foo

# cache_log IMG [OPTS...]: copy the whole export with the cache debug
# flag on; the log in $tmp/cache.log.
cache_log ()
{
  local img="$1"; shift
  timeout 120 nbdkit -v -D qcow2.cache=1 -U - qcow2 "file=$img" "$@" \
    --run 'nbdcopy "$uri" null:' 2> "$tmp/cache.log" ||
    { tail "$tmp/cache.log" >&2; fail "nbdkit -D qcow2.cache=1 $img $*"; }
  grep -q 'L2 cache' "$tmp/cache.log" ||
    fail "-D qcow2.cache=1 logged no 'L2 cache' lines"
}

# A small cache evicts; the default one covers the disk and never does.
cache_log "$img4k" l2-cache-size=16K l2-slice-size=512
grep -q 'L2 cache miss' "$tmp/cache.log" || fail "no cache misses logged"
grep -q 'L2 cache hit' "$tmp/cache.log" || fail "no cache hits logged"
grep -q 'L2 cache evict' "$tmp/cache.log" ||
  fail "a 16K cache over 128K of L2 tables logged no eviction"
grep -Eq 'L2 cache: [0-9]+ hits, [0-9]+ misses, [1-9][0-9]* evictions \(32 slices of 512 bytes\)' \
  "$tmp/cache.log" || fail "no per-connection cache totals (32 slices of 512 bytes)"
cache_log "$img4k"
if grep -q 'L2 cache evict' "$tmp/cache.log"; then
  fail "the default cache, which covers the disk, evicted"
fi

# The size of the cache logged at start matches the cache used (the
# totals logged when a connection closes), even for a cache smaller
# than the minimum.
for opts in "l2-cache-size=64K l2-slice-size=4k" "l2-cache-size=1"; do
  cache_log "$img4k" $opts
  start=$(grep -Eo 'L2 cache [0-9]+ slices of [0-9]+ bytes' "$tmp/cache.log" |
          head -1 | sed 's/L2 cache //')
  totals=$(grep -Eo '\([0-9]+ slices of [0-9]+ bytes\)' "$tmp/cache.log" |
           head -1 | tr -d '()')
  [ -n "$start" ] && [ "$start" = "$totals" ] ||
    fail "$opts: cache logged at start as '$start', used as '$totals'"
done
