#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# LUKS-encrypted images, with QEMU on the same files in both directions,
# for each kind of setup qemu-img create makes (cipher, mode, IV
# generator and its hash, PBKDF2 hash):
#  - an image qemu-img made and qemu-io wrote reads the same through
#    us; random byte-granular writes, zeroes and trims from 2
#    connections with 8 requests in flight each (diffwrite.py) agree
#    with its model; qemu-img check (with the secret) is clean and qemu
#    reads exactly the model;
#  - an image we made (create=true encrypt-format=luks) and wrote opens
#    in qemu-io with the same password, reads what we wrote, takes its
#    writes, and qemu-img check is clean; qemu-img info shows the setup;
#  - no plaintext reaches the file: a marker written through either
#    side is not in it.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
pw="correct horse battery staple"
export QEMU_SECRET=$pw
marker=PLAINTEXT-MARKER-0123456789abcdef

# qemu_luks IMG SIZE OPTS: qemu-img create an encrypted image.
qemu_luks ()
{
  qemu_img_pbkdf create -q -f qcow2 --object "secret,id=sec0,data=$pw" \
    -o "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10,$3" \
    "$1" "$2" || fail "qemu-img create -o $3"
}

# no_plaintext IMG: the marker is nowhere in the file.
no_plaintext ()
{
  ! grep -qa "$marker" "$1" || fail "$1 holds plaintext guest data"
}

# setup QEMU-OPTS OUR-ARGS...: one setup both ways.
n=0
setup ()
{
  local qopts="$1"; shift
  local img
  n=$((n + 1))
  echo "setup $n: $qopts"

  # Made by QEMU, written by both.
  img=$tmp/q$n.qcow2
  qemu_luks "$img" $((4 * M)) "cluster_size=64k${qopts:+,$qopts}"
  qio "$img" "write -P 0x5a 0 100k" "write -P 0x11 $((M + 7)) 70000" \
                  "write -z $((2 * M)) 64k" "write -P 0x22 $((4 * M - 4096)) 4096"
  nbdkit -U - qcow2 "file=$img" "password=$pw" --run '
    /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.pread(100 * 1024, 0) == b\"\x5a\" * (100 * 1024)
assert h.pread(70000, 1048583) == b\"\x11\" * 70000
assert h.pread(65536, 2 << 20) == bytes(65536)
assert h.pread(4096, (4 << 20) - 4096) == b\"\x22\" * 4096
h.pwrite(sys.argv[2].encode() * 64, 3 << 20)
h.flush()
" "$uri" '"$marker" ||
    fail "reading or writing the QEMU-made image ($qopts)"
  qio "$img" "read -P 0x5a 0 100k" "read -P 0 $((2 * M)) 64k"
  no_plaintext "$img"
  diffwrite "$img" --seed $((700 + n)) --ops 600 --connections 2 --inflight 8 \
    -- "password=$pw"

  # Made by us, written by both.
  img=$tmp/u$n.qcow2
  nbdkit -U - qcow2 "file=$img" create=true size=$((4 * M)) \
    encrypt-format=luks "password=$pw" encrypt-iter-time=10 "$@" --run '
    /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b\"\x33\" * 12345, 777)
h.pwrite(sys.argv[2].encode() * 64, 2 << 20)
h.flush()
" "$uri" '"$marker" || fail "create=true encrypt-format=luks $*"
  no_plaintext "$img"
  qio "$img" "read -P 0x33 777 12345" "read -P 0 0 777" \
                  "read -P 0 $((777 + 12345)) 100000" \
                  "write -P 0x44 $((3 * M + 5)) 9000"
  QEMU_SECRET=$pw check_written "$img"
  nbdkit -U - qcow2 "file=$img" "password=$pw" --run '
    /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.pread(9000, (3 << 20) + 5) == b\"\x44\" * 9000
assert h.pread(12345, 777) == b\"\x33\" * 12345
" "$uri"' || fail "reading back what qemu-io wrote ($*)"
  qemu-img info --output=json "$img" > "$tmp/info.json"
  /usr/bin/python3 - "$tmp/info.json" "$qopts" <<'EOF' || fail "qemu-img info of the image made with $*"
import json, sys
info = json.load(open(sys.argv[1]))
enc = info["format-specific"]["data"]["encrypt"]
want = {"cipher-alg": "aes-256", "cipher-mode": "xts", "ivgen-alg": "plain64",
        "hash-alg": "sha256"}
for kv in filter(None, sys.argv[2].split(",")):
    k, v = kv.split("=")
    want[k.split(".")[1]] = v
if want["ivgen-alg"] == "essiv":
    want.setdefault("ivgen-hash-alg", "sha256")
else:
    want.pop("ivgen-hash-alg", None)
for k, v in want.items():
    assert enc.get(k) == v, (k, enc.get(k), v)
assert info["encrypted"] and enc["format"] == "luks"
assert [s["active"] for s in enc["slots"]] == [True] + [False] * 7
EOF
}

setup ""
setup "encrypt.cipher-alg=aes-128,encrypt.hash-alg=sha1" \
  encrypt-cipher-alg=aes-128 encrypt-hash-alg=sha1
setup "encrypt.cipher-alg=aes-192,encrypt.ivgen-alg=essiv,encrypt.hash-alg=sha512" \
  encrypt.cipher-alg=aes-192 encrypt.ivgen-alg=essiv encrypt.hash-alg=sha512
setup "encrypt.cipher-alg=serpent-256,encrypt.ivgen-alg=plain,encrypt.hash-alg=ripemd160" \
  encrypt-cipher-alg=serpent-256 encrypt-ivgen-alg=plain encrypt-hash-alg=ripemd160
setup "encrypt.cipher-alg=twofish-128,encrypt.cipher-mode=cbc,encrypt.ivgen-alg=essiv,encrypt.ivgen-hash-alg=sha256,encrypt.hash-alg=sha384" \
  encrypt-cipher-alg=twofish-128 encrypt-cipher-mode=cbc encrypt-ivgen-alg=essiv \
  encrypt-ivgen-hash-alg=sha256 encrypt-hash-alg=sha384
setup "encrypt.cipher-alg=cast5-128,encrypt.cipher-mode=cbc,encrypt.ivgen-alg=essiv,encrypt.ivgen-hash-alg=md5,encrypt.hash-alg=sha224" \
  encrypt-cipher-alg=cast5-128 encrypt-cipher-mode=cbc encrypt-ivgen-alg=essiv \
  encrypt-ivgen-hash-alg=md5 encrypt-hash-alg=sha224
setup "encrypt.cipher-mode=ecb,encrypt.hash-alg=md5" \
  encrypt-cipher-mode=ecb encrypt-hash-alg=md5
setup "encrypt.cipher-alg=serpent-128,encrypt.cipher-mode=ctr" \
  encrypt-cipher-alg=serpent-128 encrypt-cipher-mode=ctr

# Extended L2 entries and 512-byte clusters, QEMU-made.
img=$tmp/extl2.qcow2
qemu_luks "$img" $((8 * M)) "extended_l2=on,cluster_size=32k"
qio "$img" "write -P 0x66 1000 50000"
diffwrite "$img" --seed 790 --ops 800 --connections 2 --inflight 8 \
  -- "password=$pw"
img=$tmp/small.qcow2
qemu_luks "$img" $((2 * M)) "cluster_size=512,encrypt.cipher-alg=aes-128"
diffwrite "$img" --seed 791 --ops 800 --connections 2 --inflight 8 \
  -- "password=$pw"

# A plain overlay over an encrypted backing file (the password opens
# every layer), and our writes copying up from it.
base=$tmp/base.qcow2 img=$tmp/over.qcow2
qemu_luks "$base" $((4 * M)) "cluster_size=4k"
qio "$base" "write -P 0x77 0 3M"
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img"
sum=$(md5sum < "$base")
nbdkit -U - qcow2 "file=$img" "password=$pw" --run '
  /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.pread(3 << 20, 0) == b\"\x77\" * (3 << 20)
h.pwrite(b\"\x01\" * 10, 4090)
assert h.pread(20, 4085) == b\"\x77\" * 5 + b\"\x01\" * 10 + b\"\x77\" * 5
h.flush()
" "$uri"' || fail "overlay over an encrypted backing file"
[ "$(md5sum < "$base")" = "$sum" ] || fail "the backing file was written"
qemu-io --object "secret,id=sec0,data=$pw" --image-opts \
  "driver=qcow2,file.filename=$img,backing.encrypt.key-secret=sec0" \
  -c "read -P 0x01 4090 10" -c "read -P 0x77 4100 4000" > "$tmp/qio.out" 2>&1 &&
  ! grep -q "failed" "$tmp/qio.out" || {
  cat "$tmp/qio.out"; fail "qemu-io reading the overlay"; }
# The qcow2 filter: over the file plugin, an image qemu-io wrote, with
# qcow2-password= (plugins below take password=); and a new encrypted
# image in the memory plugin, written and read back.
img=$tmp/u1.qcow2
nbdkit -U - --filter=qcow2 file "$img" "qcow2-password=$pw" --run '
  nbdsh -u "$uri" -c "assert h.pread(9000, (3 << 20) + 5) == b\"\x44\" * 9000"' ||
  fail "the filter over an encrypted image"
nbdkit -U - --filter=qcow2 memory 64M create=true virtual-size=16M \
  encrypt-format=luks qcow2-password=x encrypt-iter-time=10 --run '
  nbdsh -u "$uri" -c "
h.pwrite(b\"\x55\" * 100000, 12345)
assert h.pread(100000, 12345) == b\"\x55\" * 100000
assert h.pread(12345, 0) == bytes(12345)"' ||
  fail "the filter making an encrypted image in memory"

echo "$n setups both ways, extended L2, small clusters, an encrypted backing file, the filter: OK"
