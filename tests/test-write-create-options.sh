#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# qemu-img's create options, in our spelling and in qemu-img's: one
# image per option made by us (create=true) and by qemu-img create, and
# qemu-img info and qemu-img check of the two compared (everything but
# the file's size on disk; in a LUKS header, the UUID and PBKDF2
# iteration counts).  A raw backing file needs backing-fmt=.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdkit /usr/bin/python3

mkdir "$tmp/q" "$tmp/u"
qemu-img create -q -f raw "$tmp/q/base.raw" 3M
qemu-img create -q -f qcow2 "$tmp/q/base.qcow2" 5M
cp "$tmp/q/base.raw" "$tmp/q/base.qcow2" "$tmp/u/"

# An encrypted image's password, given to qemu-img as a secret object.
pw=secret-password
secret=(--object "secret,id=sec0,data=$pw")

# info_of DIR [KEY]: qemu-img info and check of DIR/img.qcow2, as JSON without
# what depends on the file system (disk size), the folder, or, in a
# LUKS header, chance (the UUID) and the CPU's speed (PBKDF2
# iterations).  KEY (",encrypt.key-secret=sec0") opens an encrypted
# image for the check.
info_of ()
{
  (cd "$1" && qemu-img info --output=json img.qcow2 &&
   qemu-img check --output=json "${secret[@]}" --image-opts \
     "driver=qcow2,file.filename=img.qcow2${2:-}") |
    /usr/bin/python3 -c '
import json, sys
d = json.JSONDecoder()
s = sys.stdin.read()
info, i = d.raw_decode(s)
check, _ = d.raw_decode(s[i:].lstrip())
for k in ("actual-size", "filename", "dirty-flag"):
    info.pop(k, None)
enc = info["format-specific"]["data"].get("encrypt", {})
for k in ("uuid", "master-key-iters"):
    enc.pop(k, None)
for slot in enc.get("slots", []):
    slot.pop("iters", None)
check.pop("filename", None)
print(json.dumps(info, sort_keys=True, indent=1))
print(json.dumps(check, sort_keys=True, indent=1))'
}

# case QEMU-OPTS OUR-ARGS...: the same image both ways.
n=0
case_ ()
{
  local qopts=$1 key=; shift
  case "$qopts" in *encrypt.format=luks*) key=,encrypt.key-secret=sec0 ;; esac
  n=$((n + 1))
  rm -f "$tmp"/[qu]/img.qcow2 "$tmp"/[qu]/data.raw
  (cd "$tmp/q" && qemu_img_pbkdf create -q -f qcow2 "${secret[@]}" \
                   ${qopts:+-o "$qopts"} img.qcow2 $size) ||
    fail "qemu-img create -o $qopts"
  (cd "$tmp/u" && nbdkit -U - qcow2 img.qcow2 create=true "$@" --run true) ||
    fail "create=true $*"
  info_of "$tmp/q" "$key" > "$tmp/q.json"
  info_of "$tmp/u" "$key" > "$tmp/u.json"
  diff -u "$tmp/q.json" "$tmp/u.json" ||
    fail "qemu-img -o '$qopts' and create=true $* differ (above)"
}

size=16M
case_ "" size=16M
case_ cluster_size=4096 size=16M cluster-size=4k
case_ cluster_size=2M size=16M cluster_size=2M
case_ compat=0.10 size=16M compat=0.10
case_ lazy_refcounts=on size=16M lazy-refcounts=true
case_ lazy_refcounts=on size=16M lazy_refcounts=on
case_ extended_l2=on size=16M extended-l2=true
case_ extended_l2=on,cluster_size=128k size=16M extended_l2=on cluster-size=128k
for bits in 1 2 4 8 16 32 64; do
  case_ refcount_bits=$bits size=16M refcount-bits=$bits
done
case_ refcount_bits=8 size=16M refcount_bits=8
case_ compression_type=zstd size=16M compression-type=zstd
case_ compression_type=zlib size=16M compression_type=zlib
case_ data_file=data.raw size=16M data-file=data.raw
case_ data_file=data.raw,data_file_raw=on size=16M data_file=data.raw data-file-raw=true
case_ data_file=data.raw,data_file_raw=on size=16M data-file=data.raw data_file_raw=on
case_ preallocation=metadata size=16M preallocation=metadata
luks=encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10
case_ $luks size=16M encrypt-format=luks password=$pw encrypt-iter-time=10
case_ $luks,encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,encrypt.ivgen-alg=essiv,encrypt.hash-alg=sha512,cluster_size=4096 \
  size=16M encrypt.format=luks password=$pw encrypt.iter-time=10 \
  encrypt.cipher-alg=aes-128 encrypt.cipher-mode=cbc encrypt.ivgen-alg=essiv \
  encrypt.hash-alg=sha512 cluster_size=4096
size=                   # the backing file's size
case_ backing_file=base.qcow2,backing_fmt=qcow2 backing=base.qcow2 backing-fmt=qcow2
case_ backing_file=base.qcow2,backing_fmt=qcow2 backing_file=base.qcow2 backing-fmt=qcow2
case_ backing_file=base.raw,backing_fmt=raw backing=base.raw backing-fmt=raw
case_ backing_file=base.raw,backing_fmt=raw backing=base.raw backing_fmt=raw
case_ backing_file=base.raw,backing_fmt=raw,cluster_size=4096 backing=base.raw backing_fmt=raw cluster_size=4096
echo "$n images compared"

# What qemu-img refuses, we refuse, saying why.
refused ()
{
  local want=$1; shift
  (cd "$tmp/u" && rm -f img.qcow2 &&
   nbdkit -U - qcow2 img.qcow2 create=true "$@" --run true) 2> "$tmp/err" &&
    fail "create=true $* was accepted"
  grep -q "$want" "$tmp/err" || fail "create=true $*: $(cat "$tmp/err")"
  [ ! -s "$tmp/u/img.qcow2" ] || fail "create=true $*: left an image behind"
  [ ! -e "$tmp/u/data.raw" ] || fail "create=true $*: left a data file behind"
}
refused "backing-fmt=raw" size=1M backing=base.raw
refused "need compat=1.1" size=1M refcount-bits=8 compat=0.10
refused "a power of two from 1 to 64" size=1M refcount-bits=3
refused "compression-type=zstd needs compat=1.1" size=1M compression-type=zstd compat=0.10
refused "data-file-raw needs data-file" size=1M data-file-raw=true
refused "cannot have a backing file" data-file=data.raw data-file-raw=true \
  backing=base.qcow2 backing-fmt=qcow2
refused "compression-type: expected zlib or zstd" size=1M compression-type=lz4

# The images we make are served and written: data lands where qemu-io
# reads it (the raw data file holds the disk as it is).
(cd "$tmp/u" && rm -f img.qcow2 data.raw &&
 nbdkit -U - qcow2 img.qcow2 create=true size=4M data-file=data.raw \
   data-file-raw=on refcount-bits=64 compression-type=zstd \
   --run 'nbdsh -u "$uri" -c "h.pwrite(b\"\\x42\" * 5000, 70000); h.flush()"') ||
  fail "writing an image with a raw data file"
(cd "$tmp/u" && qemu-img check -q img.qcow2 &&
 qemu-io -f qcow2 -c 'read -P 0x42 70000 5000' img.qcow2 >/dev/null) ||
  fail "qemu-img check / qemu-io after writes"
cmp -i 70000:0 -n 5000 "$tmp/u/data.raw" <(head -c 5000 /dev/zero | tr '\0' '\102') ||
  fail "the raw data file does not hold the disk"
