#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What clients are told: block sizes (minimum 1, preferred 4 KiB,
# maximum 32 MiB as qemu-nbd's, or max-request=) on every cluster size,
# which QEMU's client honours, and
# NBD_CMD_CACHE, which reads the range ahead: it succeeds over data,
# compressed clusters, holes and a backing file, fails past the end,
# and changes nothing that is read afterwards.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh

for cs in 512 64k 2M; do
  img=$tmp/bs-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 16M
  nbdkit -r -U - qcow2 "$img" --run 'nbdinfo "$uri"' > "$tmp/info"
  for want in "block_size_minimum: 1" "block_size_preferred: 4096" \
              "block_size_maximum: 33554432" "can_cache: true"; do
    grep -q "$want" "$tmp/info" ||
      fail "cluster size $cs: no \"$want\" in: $(cat "$tmp/info")"
  done
done

# max-request=: QEMU's client cuts a 4 MiB write there (the log
# filter sees the client's requests); nonsense is refused.
img=$tmp/bs-64k.qcow2
for pair in 4K:4096 256K:262144 32M:4194304; do
  max=${pair%:*} want=${pair#*:}
  rm -f "$tmp/log"
  nbdkit -U - --filter=log qcow2 "$img" max-request=$max \
    logfile="$tmp/log" --run "
      nbdinfo \"\$uri\" |
        grep -q 'block_size_maximum: $(numfmt --from=iec $max)' &&
      qemu-io -f raw -c 'write -P 0x33 0 4M' \"\$uri\" > /dev/null" ||
    fail "max-request=$max: not advertised, or the write failed"
  longest=$(sed -n 's/.* Write id=.* count=\(0x[0-9a-f]*\|[0-9]*\) .*/\1/p' \
              "$tmp/log" | while read -r n; do echo $((n)); done |
              sort -n | tail -1)
  [ "$longest" = "$want" ] ||
    fail "max-request=$max: the longest write was $longest, not $want"
done
# The filter takes it too, whatever the plugin below advertises.
nbdkit -U - --filter=qcow2 file "$img" max-request=256K \
  --run 'nbdinfo "$uri"' > "$tmp/info"
grep -q "block_size_maximum: 262144" "$tmp/info" ||
  fail "the filter's max-request=256K: $(grep block_size "$tmp/info")"
nbdkit -U - --filter=qcow2 file "$img" --run 'nbdinfo "$uri"' > "$tmp/info"
grep -q "block_size_maximum: 33554432" "$tmp/info" ||
  fail "the filter's default maximum: $(grep block_size "$tmp/info")"
for bad in 1K 33M 0 x; do
  if nbdkit -U - qcow2 "$img" max-request=$bad --run true 2> "$tmp/err"; then
    fail "max-request=$bad accepted"
  fi
  grep -q "max-request" "$tmp/err" || fail "max-request=$bad: $(cat "$tmp/err")"
done
qemu-img check -q "$img" || fail "the image is damaged"
qio "$img" 'read -P 0x33 0 4M' || fail "the 4 MiB write not read back"

base=$tmp/base.qcow2 img=$tmp/top.qcow2
qemu-img create -q -f qcow2 "$base" 8M
qio "$base" 'write -P 0x61 0 8M'
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img"
qio "$img" 'write -P 0x62 1M 1M' 'write -z 3M 64k'
qemu-img convert -c -f qcow2 -O qcow2 "$img" "$tmp/compressed.qcow2"
cat > "$tmp/cache.py" <<'EOS'
h.cache(h.get_size(), 0)
h.cache(4097, 12345)
try:
    h.cache(4096, h.get_size() - 1024)
    raise SystemExit("a cache past the end succeeded")
except nbd.Error:
    pass
EOS
for i in "$img" "$tmp/compressed.qcow2"; do
  qemu-img convert -f qcow2 -O raw "$i" "$tmp/want.raw"
  rm -f "$tmp/got.raw"
  nbdkit -U - qcow2 "$i" --run "nbdsh -u \"\$uri\" -c 'exec(open(\"$tmp/cache.py\").read())' &&
    nbdcopy \"\$uri\" $tmp/got.raw" || fail "$i: cache"
  cmp "$tmp/got.raw" "$tmp/want.raw" || fail "$i: data changed by cache"
done
echo "$0: ok"
