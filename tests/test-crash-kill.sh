#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Real crashes: nbdkit is killed with SIGKILL while a client has writes,
# zeroes, trims and flushes in flight (killwrite.py), over and over on
# the same images (CRASH_KILLS, default 32, in nine configurations:
# 64K clusters, 4K clusters with a small L2 cache, lazy refcounts with
# 4K and with 64K clusters, COW over a backing file, an external data file, a raw external data file,
# two enabled persistent bitmaps, and the qcow2 filter's overlay over
# the file plugin with copy-on-read, a reader filling the image from
# the plugin's file while the writes go on).  After every kill:
#  - qemu-img check finds no corruption (exit 0 or 3); an image left
#    dirty by lazy refcounts (whose refcount blocks are written only
#    when evicted or at a clean close) is first read by qemu as it is,
#    every flushed byte there, then repaired, by repair=leaks and by
#    qemu-img check -r all in turn, after which it must be clean
#    (exit 0);
#  - every byte a completed flush or FUA request covered (and nothing
#    wrote since) reads back as written, as qemu reads the image and,
#    every fourth kill, as the plugin serves it;
#  - with bitmaps, the enabled ones are left in use (inconsistent, never
#    stale; they are then removed and added again for the next round);
# and at the end, repair=leaks leaves every image clean (exit 0).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdkit nbdcopy /usr/bin/python3 timeout
requires_python_nbd

kills=${CRASH_KILLS:-32}
size=$((8 * 1024 * 1024))
configs=(c64k c4k-evict lazy lazy-64k backing datafile datafile-raw bitmaps
         overlay)

# make_base: the raw backing file of the backing and overlay images.
make_base ()
{
  [ -f "$tmp/base.raw" ] || /usr/bin/python3 -c '
import random, sys
sys.stdout.buffer.write(random.Random(7).randbytes(int(sys.argv[1])))
' "$size" > "$tmp/base.raw"
}

# config NAME: set cluster (bytes), server (nbdkit's arguments after
# its options), and make the image if it is not there yet.
config ()
{
  img=$tmp/$1.qcow2
  args=()
  case "$1" in
    c64k) cluster=65536; opts=cluster_size=64k ;;
    c4k-evict) cluster=4096; opts=cluster_size=4k
               args=(l2-cache-size=8k l2-slice-size=4k) ;;
    lazy) cluster=4096; opts=cluster_size=4k,lazy_refcounts=on ;;
    lazy-64k) cluster=65536; opts=cluster_size=64k,lazy_refcounts=on ;;
    backing) cluster=65536; opts=cluster_size=64k,backing_file=base.raw,backing_fmt=raw ;;
    datafile) cluster=4096; opts=cluster_size=4k,data_file=$tmp/$1.data ;;
    datafile-raw) cluster=65536
                  opts=cluster_size=64k,data_file=$tmp/$1.data,data_file_raw=on ;;
    bitmaps) cluster=65536; opts=cluster_size=64k ;;
    overlay) cluster=65536 ;;
  esac
  server=(qcow2 "$img" "${args[@]}")
  if [ "$1" = overlay ]; then
    server=(--filter=qcow2 file "$tmp/base.raw" qcow2-overlay="$img"
            qcow2-overlay-backing=base.raw qcow2-overlay-on-read=true)
  fi
  if [ ! -f "$img" ]; then
    case "$1" in
      backing) make_base ;;
      overlay) make_base
               nbdkit -U - "${server[@]}" --run true ;;
    esac
    [ -f "$img" ] || qemu-img create -q -f qcow2 -o "$opts" "$img" "$size"
    qemu-img convert -f qcow2 -O raw "$img" "$tmp/$1.model"
    if [ "$1" = bitmaps ]; then add_bitmaps "$img"; fi
  fi
}

add_bitmaps ()
{
  qemu-img bitmap --add -g 65536 "$1" coarse
  qemu-img bitmap --add -g 512 "$1" fine
}

# bitmaps_in_use IMG: how many bitmaps are marked in use.
bitmaps_in_use ()
{
  qemu-img info --output=json "$1" | /usr/bin/python3 -c '
import json, sys
bms = json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", [])
print(sum("in-use" in b["flags"] for b in bms), len(bms))
'
}

dirty_bit ()
{
  /usr/bin/python3 "$srcdir/qcow2-patch.py" "$1" be64 72 | {
    read -r v; echo $(( v & 1 ))
  }
}

# check_clean IMG EXPECTED-EXITS: qemu-img check must exit with one of
# EXPECTED-EXITS (e.g. "0 3").
check_clean ()
{
  local r=0
  qemu-img check "$1" > "$tmp/check.out" 2>&1 || r=$?
  case " $2 " in
    *" $r "*) ;;
    *) cat "$tmp/check.out" >&2
       fail "qemu-img check $1 exited with $r (kill $i), expected one of: $2" ;;
  esac
}

# compare_durable RAW EXPECTED DIRTY: RAW must equal EXPECTED wherever
# DIRTY is 0.
compare_durable ()
{
  /usr/bin/python3 -c '
import sys
raw, exp, dirty = (open(f, "rb").read() for f in sys.argv[1:4])
clean = bytes.maketrans(b"\0\1", b"\xff\0")
for o in range(0, len(exp), 65536):
    a, b = raw[o:o + 65536], exp[o:o + 65536]
    if a == b:
        continue
    m = dirty[o:o + 65536].translate(clean)
    x = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    if x & int.from_bytes(m, "big"):
        for j in range(len(a)):
            if m[j] and a[j] != b[j]:
                sys.exit("byte %#x is %#x, flushed as %#x" % (o + j, a[j], b[j]))
' "$@"
}

sock=$tmp/sock
sent=0 flushed=0 inflight=0 leaky=0 repaired=0 qemu_repaired=0
for i in $(seq 1 "$kills"); do
  name=${configs[$(( i % ${#configs[@]} ))]}
  config "$name"
  rm -f "$sock" "$tmp/pid" "$tmp/status"
  # In a subshell whose stderr hides bash's "Killed".
  (
    r=0
    timeout -k 10 "${TEST_TIMEOUT:-120}" \
      nbdkit -f -U "$sock" -P "$tmp/pid" "${server[@]}" \
        2> "$tmp/nbdkit.err" || r=$?
    echo "$r" > "$tmp/status"
  ) 2>/dev/null &
  wrapper=$!
  for t in $(seq 200); do
    [ -S "$sock" ] && [ -s "$tmp/pid" ] && break
    sleep 0.05
  done
  [ -S "$sock" ] || { cat "$tmp/nbdkit.err" >&2; fail "nbdkit did not start"; }
  # The overlay: a reader fills the image (copy-on-read) meanwhile,
  # until the kill ends its connection (or refuses it).
  reader=
  if [ "$name" = overlay ]; then
    /usr/bin/python3 -c '
import random, sys, nbd
h = nbd.NBD()
r = random.Random(int(sys.argv[2]))
try:  # the kill may come before the connection
    h.connect_unix(sys.argv[1])
    size = h.get_size()
    while True:
        off = r.randrange(size)
        h.pread(min(1 + r.randrange(1 << 20), size - off), off)
except nbd.Error:
    pass
' "$sock" "$i" &
    reader=$!
  fi
  /usr/bin/python3 "$srcdir/killwrite.py" "$sock" "$(cat "$tmp/pid")" \
    "$tmp/$name.model" "$cluster" "$i" "$tmp/expected" "$tmp/dirty" \
    > "$tmp/counts" || fail "killwrite.py (kill $i, $name)"
  [ -z "$reader" ] || wait "$reader" || fail "the reader (kill $i)"
  read -r a b c < "$tmp/counts"
  sent=$((sent + a)) flushed=$((flushed + b)) inflight=$((inflight + c))
  wait "$wrapper"
  r=$(cat "$tmp/status")
  [ "$r" -eq 137 ] || { cat "$tmp/nbdkit.err" >&2;
                        fail "nbdkit exited with $r, not killed (kill $i)"; }

  if [ "$(dirty_bit "$img")" = 1 ]; then
    # Lazy refcounts: qemu reads the image as it is, but the spec says
    # to repair it before anything else; by us and by qemu in turn.
    qemu-img convert -f qcow2 -O raw "$img" "$tmp/now.raw"
    compare_durable "$tmp/now.raw" "$tmp/expected" "$tmp/dirty" ||
      fail "kill $i ($name): flushed data lost (dirty image, before repair)"
    if [ $(( i / ${#configs[@]} % 2 )) = 0 ]; then
      nbdkit -U - "${server[@]}" repair=leaks --run true \
             2> "$tmp/repair.err" ||
        { cat "$tmp/repair.err" >&2; fail "repair=leaks (kill $i, $name)"; }
    else
      qemu-img check -q -r all "$img" > "$tmp/repair.err" 2>&1 ||
        { cat "$tmp/repair.err" >&2;
          fail "qemu-img check -r all (kill $i, $name)"; }
      [ "$(dirty_bit "$img")" = 0 ] ||
        fail "kill $i ($name): still dirty after qemu-img check -r all"
      qemu_repaired=$((qemu_repaired + 1))
    fi
    check_clean "$img" 0
    repaired=$((repaired + 1))
  else
    check_clean "$img" "0 3"
    grep -q "leaked clusters" "$tmp/check.out" && leaky=$((leaky + 1))
  fi
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/now.raw"
  compare_durable "$tmp/now.raw" "$tmp/expected" "$tmp/dirty" ||
    fail "kill $i ($name): flushed data lost"
  if [ "$name" = bitmaps ]; then
    [ "$(bitmaps_in_use "$img")" = "2 2" ] ||
      fail "kill $i: bitmaps not left in use: $(bitmaps_in_use "$img")"
    qemu-img bitmap --remove "$img" coarse
    qemu-img bitmap --remove "$img" fine
    add_bitmaps "$img"
  fi
  if [ $(( i % 4 )) = 0 ]; then
    nbdkit -r -U - qcow2 "$img" --run 'nbdcopy "$uri" '"$tmp/served.raw"
    cmp "$tmp/now.raw" "$tmp/served.raw" ||
      fail "kill $i ($name): the plugin serves other data than qemu reads"
  fi
  mv "$tmp/now.raw" "$tmp/$name.model"
done

for name in "${configs[@]}"; do
  config "$name"
  nbdkit -U - "${server[@]}" repair=leaks --run true 2> "$tmp/repair.err" ||
    { cat "$tmp/repair.err" >&2; fail "repair=leaks of $name"; }
  check_clean "$img" 0
done
echo "$kills kills ($sent requests, $flushed flushes, $inflight requests in" \
  "flight at the kills; $leaky images with leaks, $repaired dirty ones" \
  "repaired, $qemu_repaired of them by qemu-img): no corruption, no" \
  "flushed data lost"
