#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What the plugin tells its user: every parse error names its option;
# io-threads is capped; a missing backing file gets a hint; -v says,
# layer by layer, what was opened and how it is locked; --dump-plugin
# lists what this build can do; notices go where nbdkit logs (so
# --log=null silences them, as it does nbdkit's own messages, and
# --log=syslog takes them off stderr), and say "notice", not "error";
# --help lists every option; a qemu-img -o list is taken as options=.
# (Notices in syslog: test-messages-syslog.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 4M

# Parse errors: the option named, and the value.
expect_refused 'l2-cache-size: expected a size.*"foo"' qcow2 "$img" l2-cache-size=foo
expect_refused 'l2-slice-size: expected a size.*"4x"' qcow2 "$img" l2-slice-size=4x
expect_refused 'readonly: expected true or false.*"maybe"' qcow2 "$img" readonly=maybe
expect_refused 'create: expected true or false.*"later"' qcow2 "$img" create=later
expect_refused 'overlap-check.active-l1: expected true or false.*"sometimes"' \
  qcow2 "$img" overlap-check.active-l1=sometimes
expect_refused 'io-threads' qcow2 "$img" io-threads=many
expect_refused 'locking: expected on, off or auto, not "yes please"' \
  qcow2 "$img" "locking=yes please"

# One line, ours: nbdkit's own parsers (whose line would come first,
# not naming the key) are not used; the plugin's and the filter's keys.
for kv in l2-cache-size=foo l2-cache-size=1.5x cluster-size=4x readonly=maybe \
          stream=perhaps stream-rate=fast; do
  expect_refused "^nbdkit: error: ${kv%%=*}: expected .*\"${kv#*=}\"\$" qcow2 "$img" "$kv"
  [ "$(wc -l < "$tmp/refused.err")" -eq 1 ] ||
    fail "$kv: not one line: $(cat "$tmp/refused.err")"
done
expect_refused '^nbdkit: error: l2-cache-size: "8E" is too large' qcow2 "$img" l2-cache-size=8E
for kv in virtual-size=1x create=later; do
  expect_refused "^nbdkit: error: ${kv%%=*}: expected .*\"${kv#*=}\"\$" \
    --filter=qcow2 memory 1M "$kv"
  [ "$(wc -l < "$tmp/refused.err")" -eq 1 ] ||
    fail "the filter's $kv: not one line: $(cat "$tmp/refused.err")"
done
# What nbdkit's parsers take is still taken (sectors, any case), and
# qemu-img's fractions.
nbdkit -U - qcow2 "$img" l2-cache-size=1.5M l2-slice-size=8s readonly=Yes \
  --run 'nbdinfo --size "$uri"' > /dev/null || fail "a size or boolean refused"

# io-threads: at most 64, refused at once beyond, naming 64.
start=$(date +%s)
expect_refused 'io-threads: expected a number of threads \(a whole number from 0 to 64\), not "100000"' \
  qcow2 "$img" io-threads=100000
[ $(( $(date +%s) - start )) -lt 5 ] || fail "io-threads=100000 took long to refuse"
nbdkit -U - qcow2 "$img" io-threads=64 --run 'nbdinfo --size "$uri"' >/dev/null ||
  fail "io-threads=64 refused"

# A missing backing file: what to do about it.
qemu-img create -q -f qcow2 -u -b gone.qcow2 -F qcow2 "$tmp/orphan.qcow2" 4M
expect_refused 'cannot open backing file ".*/gone.qcow2": No such file or directory$' \
  qcow2 "$tmp/orphan.qcow2"
grep -q '^nbdkit: error: hint: backing=none serves the image without it; "qemu-img rebase -u -b NEW-NAME -F FORMAT IMAGE"' \
  "$tmp/refused.err" || fail "a missing backing file: no remedy in a hint"
nbdkit -U - qcow2 "$tmp/orphan.qcow2" backing=none --run 'nbdinfo --size "$uri"' \
  >/dev/null || fail "backing=none does not serve the orphan"

# -v: one line per layer (top first) with its geometry (its L2 cache
# covers the disk: 4 MiB of 4 KiB clusters, 8 KiB of L2 entries, two
# slices of 4 KiB), and its lock.
qemu-img create -q -f raw "$tmp/base.raw" 4M
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/mid.qcow2"
qemu-img create -q -f qcow2 -o cluster_size=4k,extended_l2=off \
  -b mid.qcow2 -F qcow2 "$tmp/top.qcow2"
nbdkit -v -U - qcow2 "$tmp/top.qcow2" \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/v.log" || fail "nbdkit -v"
grep -E 'top.qcow2: (qcow2 v|raw|locked)|mid.qcow2: (qcow2 v|raw|locked)|base.raw: (qcow2 v|raw|locked)' \
  "$tmp/v.log" | sed 's/.*debug: //' > "$tmp/layers"
cat "$tmp/layers"
[ "$(wc -l < "$tmp/layers")" -eq 6 ] || fail "not two lines per layer"
sed -n 2p "$tmp/layers" | grep -qE \
  'top.qcow2: qcow2 v3, 4096-byte clusters, virtual size 4194304, 16-bit refcounts, zlib compression, backing "mid.qcow2" \(qcow2\), data file none, L2 cache 2 slices of 4096 bytes, read-write$' ||
  fail "the top layer's line"
sed -n 1p "$tmp/layers" | grep -qE 'top.qcow2: locked as QEMU locks an image it writes' ||
  fail "the top layer's lock line"
sed -n 3,4p "$tmp/layers" | grep -qE 'mid.qcow2: qcow2 v3, 65536-byte clusters, .*backing "base.raw" \(raw\), .*read-only$' ||
  fail "the middle layer's line"
sed -n 5,6p "$tmp/layers" | grep -qE 'base.raw: raw, size 4194304, read-only$' ||
  fail "the raw base's line"
grep -qE 'base.raw: locked as QEMU locks an image it reads' "$tmp/layers" ||
  fail "the raw base's lock line"
nbdkit -v -U - qcow2 "$img" locking=off --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/v.log" || fail "nbdkit -v locking=off"
grep -qF "img.qcow2: not locked (locking=off)" "$tmp/v.log" ||
  fail "locking=off not said with -v"

# --dump-plugin: the plugin's keys.
nbdkit --dump-plugin qcow2 > "$tmp/dump" || fail "--dump-plugin"
version=$(sed -n "s/^PACKAGE_VERSION = //p" "${abs_top_builddir:-..}/Makefile")
for key in qcow2_version=$version qcow2_zlib=yes qcow2_zstd=yes \
           qcow2_versions=2,3 qcow2_encryption=luks qcow2_io_threads_max=64 \
           qcow2_stream=yes qcow2_backing_policy=yes; do
  grep -qx "$key" "$tmp/dump" || fail "--dump-plugin lacks $key"
done
grep -qE '^qcow2_features=.*backing.*create-if-missing.*,stream,backing-policy,' "$tmp/dump" ||
  fail "--dump-plugin lacks the features"
# What it reads and writes, as the build does: encrypted images too,
# and compressed writes.
grep -qx 'qcow2_read=qemu-img-images,luks' "$tmp/dump" &&
  grep -qx 'qcow2_write=qemu-img-images,luks,compressed' "$tmp/dump" ||
  fail "--dump-plugin lacks qcow2_read or qcow2_write"
grep -qE '^qcow2_features=(.*,)?luks,compressed-writes,persistent-overlay$' "$tmp/dump" ||
  fail "--dump-plugin: qcow2_features lacks LUKS, compressed writes or the overlay"
# Every value a token, as nbdkit's own: no spaces or brackets.
! grep -E '^qcow2_[a-z_]*=.*[][ (){}]' "$tmp/dump" ||
  fail "--dump-plugin: a value that is not a token"
! grep -qE '^qcow2_(read|write)=.*(unencrypted|uncompressed)' "$tmp/dump" ||
  fail "--dump-plugin says what the build does not: $(grep '^qcow2_[rw]' "$tmp/dump")"

# Notices go through nbdkit's log: present by default, and gone with
# --log=null (a notice written straight to stderr would remain).  The
# notice: create=if-missing serving a larger image than size=.
notice='create=if-missing: the image there is served as it is: its virtual size is 4194304 bytes, more than size=1048576'
nbdkit -U - qcow2 "$img" create=if-missing size=1M --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/notice.log" || fail "create=if-missing: $(cat "$tmp/notice.log")"
grep -qE "^nbdkit: .*$img: $notice" "$tmp/notice.log" ||
  fail "no notice of the larger image: $(cat "$tmp/notice.log")"
nbdkit --log=null -U - qcow2 "$img" create=if-missing size=1M \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/notice.log" ||
  fail "create=if-missing, --log=null"
! grep -q "served as it is" "$tmp/notice.log" ||
  fail "a notice bypassed nbdkit's logging"
# A notice is not an error, and shows without -v.
nbdkit -U - qcow2 "$img" create=if-missing size=1M --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/notice.log" || fail "create=if-missing: $(cat "$tmp/notice.log")"
grep -qE "^nbdkit: qcow2: notice: $img: $notice \(grown since it was made, as by qemu-img resize\)$" \
  "$tmp/notice.log" || fail "the notice: $(cat "$tmp/notice.log")"
! grep -qi error "$tmp/notice.log" || fail "a notice said as an error"
nbdkit --log=stderr -U - qcow2 "$img" create=if-missing size=1M \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/notice.log" ||
  fail "create=if-missing, --log=stderr"
grep -q "notice: .*served as it is" "$tmp/notice.log" ||
  fail "--log=stderr: no notice"
nbdkit --log=syslog -U - qcow2 "$img" create=if-missing size=1M \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/notice.log" ||
  fail "create=if-missing, --log=syslog"
! grep -q "served as it is" "$tmp/notice.log" ||
  fail "--log=syslog: the notice went to stderr"
# snapshot=NAME asks for a read-only export: no notice (-v says it).
qemu-img snapshot -c s1 "$img"
nbdkit -v -U - qcow2 "$img" snapshot=s1 --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/notice.log" || fail "snapshot export"
! grep -q "notice" "$tmp/notice.log" || fail "snapshot=s1: a notice"
grep -q "debug: .*snapshot s1 served read-only" "$tmp/notice.log" ||
  fail "snapshot=s1: -v does not say it is read-only"

# qemu-img's spellings of compat= and fractional sizes.
for c in v2:0.10 v3:1.1; do
  rm -f "$tmp/c.qcow2"
  nbdkit -U - qcow2 "$tmp/c.qcow2" create=true size=1.5G compat=${c%%:*} \
    --run 'nbdinfo --size "$uri"' > "$tmp/c.size" || fail "compat=${c%%:*} size=1.5G"
  [ "$(cat "$tmp/c.size")" = 1610612736 ] || fail "size=1.5G: $(cat "$tmp/c.size")"
  qemu-img info "$tmp/c.qcow2" | grep -qx "    compat: ${c#*:}" ||
    fail "compat=${c%%:*}: $(qemu-img info "$tmp/c.qcow2")"
done
expect_refused '^nbdkit: error: size: expected a size such as 512, 64K, 1G or 1.5G, not "1.5"$' \
  qcow2 "$tmp/n.qcow2" create=true size=1.5

# Parse errors say what was expected, naming the option, in one line.
expect_refused '^nbdkit: error: encrypt-iter-time: expected milliseconds \(a whole number\), not "abc"$' \
  qcow2 "$tmp/n.qcow2" create=true size=1M encrypt-format=luks password=x \
  encrypt-iter-time=abc
expect_refused '^nbdkit: error: refcount-bits: expected bits \(1, 2, 4, 8, 16, 32 or 64\) \(a whole number from 0 to 64\), not "sixteen"$' \
  qcow2 "$tmp/n.qcow2" create=true size=1M refcount-bits=sixteen
expect_refused '^nbdkit: error: io-threads: expected a number of threads \(a whole number from 0 to 64\), not "many"$' \
  qcow2 "$img" io-threads=many
expect_refused '^nbdkit: error: io-threads: expected a number of threads \(a whole number from 0 to 64\), not "-1"$' \
  qcow2 "$img" io-threads=-1
expect_refused '^nbdkit: error: remote-timeout: expected seconds \(a whole number from 1 to 86400\), not "abc"$' \
  qcow2 "$img" remote-timeout=abc
expect_refused '^nbdkit: error: remote-timeout: expected seconds \(a whole number from 1 to 86400\), not "0"$' \
  qcow2 "$img" remote-timeout=0
[ "$(grep -c '^nbdkit:' "$tmp/refused.err")" -eq 1 ] || fail "not one line"

# qemu-img's -o list: as options=, each key as if given alone (",," a
# comma); pasted as one key's value, refused, naming options=.
expect_refused '^nbdkit: error: cluster_size: "4K,lazy_refcounts=on" holds more options: a qemu-img -o list is given as options=cluster_size=4K,lazy_refcounts=on$' \
  qcow2 "$tmp/n.qcow2" create=true size=1M cluster_size=4K,lazy_refcounts=on
[ "$(grep -c '^nbdkit:' "$tmp/refused.err")" -eq 1 ] || fail "not one line"
nbdkit -U - qcow2 "$tmp/o.qcow2" create=true \
  options=size=2M,cluster_size=4K,lazy_refcounts=on,data_file="$tmp/d,,1.raw" \
  --run 'nbdinfo --size "$uri"' > "$tmp/o.size" || fail "options="
[ "$(cat "$tmp/o.size")" = 2097152 ] || fail "options=size=2M: $(cat "$tmp/o.size")"
qemu-img info --output=json "$tmp/o.qcow2" > "$tmp/o.json"
/usr/bin/python3 -c '
import json, sys
i = json.load(open(sys.argv[1]))
s = i["format-specific"]["data"]
assert i["cluster-size"] == 4096, i
assert s["lazy-refcounts"], s
assert s["data-file"] == sys.argv[2] + "/d,1.raw", s' "$tmp/o.json" "$tmp" ||
  fail "options= made another image: $(cat "$tmp/o.json")"
[ -f "$tmp/d,1.raw" ] || fail "options=data_file=d,,1.raw: no file d,1.raw"
expect_refused '^nbdkit: error: options: nosuch is not an option of a new image' \
  qcow2 "$tmp/n.qcow2" create=true options=size=1M,nosuch=1
expect_refused '^nbdkit: error: options: encrypt.key-secret names a QEMU secret object: give the password itself with password=' \
  qcow2 "$tmp/n.qcow2" create=true options=size=1M,encrypt.format=luks,encrypt.key-secret=sec0
[ ! -e "$tmp/n.qcow2" ] || fail "a refused create left a file"

# --help lists every option, each where nbdkit's bash completion
# finds keys (a line starting KEY=), but file= (nbdkit's magic key).
nbdkit qcow2 --help > "$tmp/help"
grep -q -- '\[file=\]' "$tmp/help" || fail "--help lacks file="
grep -E '^[-a-z0-9]+=' "$tmp/help" | sed 's/=.*/=/' > "$tmp/completion"
for key in backing= data-file= password= cache= snapshot= \
           readonly= discard= repair= compress= locking= \
           overlap-check= l2-cache-size= l2-slice-size= io-threads= \
           stream= stream-base= stream-rate= stream-detach= \
           create= size= backing-fmt= data-file-raw= cluster-size= \
           compat= extended-l2= lazy-refcounts= refcount-bits= \
           compression-type= preallocation= encrypt-format= \
           encrypt-cipher-alg= encrypt-cipher-mode= encrypt-ivgen-alg= \
           encrypt-ivgen-hash-alg= encrypt-hash-alg= encrypt-iter-time= \
           options=; do
  grep -qx -- "$key" "$tmp/completion" || fail "--help: $key not at a line's start"
done
grep -q '^preallocation=off|metadata|falloc|full ' "$tmp/help" ||
  fail "--help: the plugin's preallocation= values"
