#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# create=true with preallocation= (metadata, falloc, full, and off as
# the baseline), over each axis at least once: cluster sizes from 512
# bytes to 2 MiB, extended L2, LUKS, an external data file, a backing
# file (extended L2 only, as qemu-img), sizes that are not a multiple
# of the cluster size.  Each image is written and read in the run that
# made it and in a new run; qemu-img makes the same image and qemu-io
# does the same writes; then:
#  - both pass qemu-img check;
#  - qemu-img map of the two agrees on what is allocated;
#  - ours reads as a raw model does (zeros or the backing file, and the
#    writes), through us and through qemu, and so does qemu's image
#    but for LUKS, where qemu's preallocated clusters decrypt to noise
#    (we write encrypted zeros, so that the disk reads as zeros).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh nbdcopy /usr/bin/python3

pw=prealloc-secret
secret=(--object "secret,id=sec0,data=$pw")
mkdir "$tmp/u" "$tmp/q"
qemu-img create -q -f qcow2 "$tmp/u/base.qcow2" 3M
qio "$tmp/u/base.qcow2" "write -P 0xba 0 3M"
qemu-img create -q -f raw "$tmp/u/base.raw" 3M
QIO_FMT=raw qio "$tmp/u/base.raw" "write -P 0xbb 0 3M"
cp "$tmp/u/base.qcow2" "$tmp/u/base.raw" "$tmp/q/"

# The writes, as nbdsh lines and as qemu-io commands: the first run's
# (a partial first sector, a write across clusters, the last bytes of
# the disk) and the second run's (over them in part, and a zero).
writes1 ()      # SIZE FORM
{
  local s=$1
  if [ "$2" = nbd ]; then
    printf '%s\n' "h.pwrite(b'\\x11' * 700, 0)" \
      "h.pwrite(b'\\x12' * 200000, 70000)" \
      "h.pwrite(b'\\x13' * 3000, $((s - 3000)))"
  else
    printf '%s\n' "write -P 0x11 0 700" "write -P 0x12 70000 200000" \
      "write -P 0x13 $((s - 3000)) 3000"
  fi
}
writes2 ()
{
  local s=$1
  if [ "$2" = nbd ]; then
    printf '%s\n' "h.pwrite(b'\\x21' * 5000, 60000)" \
      "h.zero(4096, 131072)" "h.pwrite(b'\\x22' * 512, $((s / 2)))"
  else
    printf '%s\n' "write -P 0x21 60000 5000" "write -z 131072 4096" \
      "write -P 0x22 $((s / 2)) 512"
  fi
}

# model SIZE BACKING RAW-OUT: the disk after both runs' writes.
model ()
{
  rm -f "$3"
  if [ -n "$2" ]; then
    qemu-img convert -O raw "$tmp/u/$2" "$3"
    qemu-img resize -q -f raw "$3" "$1"
  else
    qemu-img create -q -f raw "$3" "$1"
  fi
  local cmds
  mapfile -t cmds < <(writes1 "$1" io; writes2 "$1" io)
  QIO_FMT=raw qio "$3" "${cmds[@]}"
}

# map_of IMG [KEY]: which ranges qemu-img map says are allocated (the
# data flag, runs merged).  Not the zero flag: of an allocated cluster
# it says where the file has holes, and we write only the new bytes
# into a cluster that reads as zeros, where QEMU writes it whole.
map_of ()
{
  qemu-img map --output=json "${secret[@]}" --image-opts \
    "driver=qcow2,file.filename=$1${2:-}" |
    /usr/bin/python3 -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    if out and out[-1][2] == e["data"]:
        out[-1][1] += e["length"]
    else:
        out.append([e["start"], e["length"], e["data"]])
for s, l, d in out:
    print(s, l, int(d))
'
}

# case_ QEMU-OPTS SIZE OUR-ARGS...: one image both ways.  SIZE: bytes,
# a multiple of 512, or empty to take the backing file's.
n=0
case_ ()
{
  local qopts=$1 size=$2 key= backing= vsize; shift 2
  n=$((n + 1))
  case "$qopts" in *encrypt.format=luks*) key=,encrypt.key-secret=sec0 ;; esac
  case "$qopts" in *backing_file=*)
    backing=${qopts#*backing_file=}; backing=${backing%%,*} ;;
  esac
  vsize=${size:-3145728}
  rm -f "$tmp"/[uq]/img.qcow2 "$tmp"/[uq]/data.raw

  # Ours: made, written and read back; then written and read again in
  # a second run.
  model "$vsize" "$backing" "$tmp/model.raw"
  (cd "$tmp/u" &&
   nbdkit -U - qcow2 img.qcow2 create=true ${size:+size=$size} "$@" --run '
     set -e
     nbdsh -u "$uri" -c "
'"$(writes1 "$vsize" nbd)"'
h.flush()
assert h.get_size() == '"$vsize"'
"
     nbdcopy "$uri" "'"$tmp/run1.raw"'"') ||
    fail "create=true $*: the first run"
  (cd "$tmp/u" &&
   nbdkit -U - qcow2 img.qcow2 ${key:+password=$pw} --run '
     set -e
     nbdsh -u "$uri" -c "
'"$(writes2 "$vsize" nbd)"'
h.flush()
"
     nbdcopy "$uri" "'"$tmp/run2.raw"'"') ||
    fail "create=true $*: the second run"
  # The first run read what the second run's writes had not changed.
  cmp -s "$tmp/run2.raw" "$tmp/model.raw" ||
    fail "create=true $*: the second run reads other data than the model"
  /usr/bin/python3 - "$tmp/run1.raw" "$tmp/model.raw" "$vsize" <<'EOF' ||
import sys
a = open(sys.argv[1], "rb").read()
m = open(sys.argv[2], "rb").read()
size = int(sys.argv[3])
# The second run's writes: [60000, 65000), [131072, 135168), the 512
# bytes at size/2.  Elsewhere the first run read what the model holds.
skip = [(60000, 65000), (131072, 135168), (size // 2, size // 2 + 512)]
for lo, hi in [(0, 60000), (65000, 131072), (135168, size // 2),
               (size // 2 + 512, size)]:
    if a[lo:hi] != m[lo:hi]:
        sys.exit(1)
EOF
    fail "create=true $*: the first run read other data than the model"

  # qemu's: the same options, the same writes.
  (cd "$tmp/q" && qemu_img_pbkdf create -q -f qcow2 "${secret[@]}" \
                    -o "$qopts" img.qcow2 $size) ||
    fail "qemu-img create -o $qopts"
  local cmds
  mapfile -t cmds < <(writes1 "$vsize" io; writes2 "$vsize" io)
  (cd "$tmp/q" && QEMU_SECRET=${key:+$pw} qio img.qcow2 "${cmds[@]}")

  for side in u q; do
    (cd "$tmp/$side" && qemu-img check -q "${secret[@]}" --image-opts \
       "driver=qcow2,file.filename=img.qcow2$key") ||
      fail "qemu-img check of the $side image: $qopts"
  done
  (cd "$tmp/u" && map_of img.qcow2 "$key") > "$tmp/u.map"
  (cd "$tmp/q" && map_of img.qcow2 "$key") > "$tmp/q.map"
  diff -u "$tmp/q.map" "$tmp/u.map" ||
    fail "qemu-img map of create=true $* differs from qemu-img create -o $qopts"
  # QEMU reads our image as the model, and its own too (each from its
  # folder: QEMU opens a relative data file name from there).
  (cd "$tmp/u" && qemu-img compare -q "${secret[@]}" --image-opts \
     "driver=qcow2,file.filename=img.qcow2$key" \
     "driver=raw,file.filename=$tmp/model.raw") ||
    fail "qemu reads create=true $* other than the model"
  if [ -z "$key" ]; then
    (cd "$tmp/q" && qemu-img compare -q -f qcow2 -F raw img.qcow2 \
       "$tmp/model.raw") ||
      fail "qemu-img create -o $qopts reads other than create=true $*"
  fi
}

luks=encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10
ourluks=(encrypt-format=luks password=$pw encrypt-iter-time=10)

case_ preallocation=off,cluster_size=64k 1049088 preallocation=off
case_ preallocation=metadata,cluster_size=512 1000448 \
  preallocation=metadata cluster-size=512
case_ preallocation=falloc,cluster_size=4k 3147264 \
  preallocation=falloc cluster-size=4K
case_ preallocation=full,cluster_size=64k 2100224 preallocation=full
case_ preallocation=metadata,cluster_size=2M 5243392 \
  preallocation=metadata cluster-size=2M
case_ preallocation=falloc,cluster_size=2M,extended_l2=on 3145728 \
  preallocation=falloc cluster-size=2M extended-l2=on
case_ preallocation=full,cluster_size=128k,extended_l2=on 1055744 \
  preallocation=full cluster-size=128K extended-l2=on
case_ preallocation=metadata,extended_l2=on,data_file=data.raw 2098176 \
  preallocation=metadata extended-l2=on data-file=data.raw
case_ preallocation=falloc,cluster_size=4k,data_file=data.raw 1053696 \
  preallocation=falloc cluster-size=4K data-file=data.raw
case_ preallocation=full,data_file=data.raw 1049088 \
  preallocation=full data-file=data.raw
case_ preallocation=metadata,$luks 2097664 preallocation=metadata "${ourluks[@]}"
case_ preallocation=falloc,cluster_size=4k,$luks 1048576 \
  preallocation=falloc cluster-size=4K "${ourluks[@]}"
case_ preallocation=full,cluster_size=32k,extended_l2=on,$luks 1049600 \
  preallocation=full cluster-size=32K extended-l2=on "${ourluks[@]}"
case_ preallocation=full,cluster_size=16k,data_file=data.raw,$luks 1051136 \
  preallocation=full cluster-size=16K data-file=data.raw "${ourluks[@]}"
# A backing file: with extended L2 its data shows through what is
# preallocated, in the run that made the image and after.
case_ preallocation=metadata,extended_l2=on,backing_file=base.qcow2,backing_fmt=qcow2 "" \
  preallocation=metadata extended-l2=on backing=base.qcow2
case_ preallocation=full,cluster_size=32k,extended_l2=on,backing_file=base.raw,backing_fmt=raw 4194304 \
  preallocation=full cluster-size=32K extended-l2=on backing=base.raw backing-fmt=raw
case_ preallocation=falloc,cluster_size=16k,extended_l2=on,backing_file=base.qcow2,backing_fmt=qcow2 "" \
  preallocation=falloc cluster-size=16K extended-l2=on backing=base.qcow2
echo "$n images compared"

# Without extended L2, qemu-img refuses a backing file with
# preallocation, and so do we, before touching the file.
for p in metadata falloc full; do
  (cd "$tmp/q" && rm -f img.qcow2 &&
   ! qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 \
     -o preallocation=$p img.qcow2 2>/dev/null) ||
    fail "qemu-img accepts a backing file with preallocation=$p"
  (cd "$tmp/u" && rm -f img.qcow2 &&
   expect_refused "backing file and preallocation.*extended-l2=on" \
     qcow2 img.qcow2 create=true backing=base.qcow2 preallocation=$p &&
   [ ! -e img.qcow2 ]) || fail "backing= preallocation=$p: not refused"
done
