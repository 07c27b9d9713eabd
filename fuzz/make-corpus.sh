#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Regenerate the seed corpus in fuzz/corpus/ with qemu-img and qemu-io:
# small valid images of each kind the engine reads, each followed by
# the harness's 8-byte control word (see fuzz-qcow2.c).  Not run by CI;
# run it by hand after changing the list, and commit the result.
#
# Images are tiny: small virtual sizes and small clusters.  Backing and
# data file names are those the harness provides beside the image
# (base.raw, base.qcow2, data.raw, disk.qcow2).
set -euo pipefail
cd "$(dirname "$0")"
out=$PWD/corpus

# make-corpus.sh names: only the seeds of fuzz-names (corpus-names/),
# one file per name in QEMU's forms below; " => " in a line separates
# the name of a naming image from the name it holds (resolved).
if [ "${1:-}" = names ]; then
  rm -rf corpus-names
  mkdir corpus-names
  n=0
  while IFS= read -r line; do
    n=$((n + 1))
    printf '%s' "${line/ => /$'\n'}" > "corpus-names/$(printf %03d $n)"
  done <<'NAMES'
base.qcow2
/images/base.raw
../up/base.qcow2
file:/images/base.raw
file:base.raw
nbd://127.0.0.1:10809/export
nbd://[::1]/e%20x
nbd+tcp://host/
nbd+unix:///export?socket=/run/nbd.sock
nbds://host:10809/
nbds+unix:///?socket=/tmp/s
nbd:localhost:10809
nbd:localhost:10809:exportname=disk
nbd:unix:/run/nbd.sock
nbd:unix:/run/nbd.sock:exportname=disk
nbd:[::1]:10809
http://host/dir/base.raw
https://user@host:8443/a%2Fb?x=1#frag
ssh://user@host:22/srv/base.qcow2
ssh://[::1]/srv/base.qcow2?host_key_check=no
ssh://host/srv/base.qcow2?host_key_check=yes
iscsi://host/iqn.2001-04.com.example/1
json:{"driver":"raw","file":{"driver":"nbd","server":{"type":"unix","path":"/run/base.sock"}}}
json:{"driver": "raw", "file": {"server.host": "127.0.0.1", "server.port": "10809", "driver": "nbd", "server.type": "inet", "export": ""}}
json:{"file.driver":"nbd","file.host":"::1","file.port":"10809","driver":"raw"}
json:{"driver":"nbd","path":"/s"}
json:{"driver":"raw","file":{"driver":"https","url":"https://host/base.raw","sslverify":false,"timeout":20,"readahead":65536}}
json:{"driver":"raw","file":{"driver":"http","url":"http://host/x","cookie":"a=b; c=d"}}
json:{"driver":"raw","file":{"driver":"ssh","server":{"host":"host","port":"22"},"path":"/srv/b","user":"u","host-key-check":{"mode":"none"}}}
json:{"driver":"raw","file":{"driver":"ssh","host":"h","path":"/p","host_key_check":"no"}}
json:{"driver":"raw","file":{"driver":"file","filename":"/images/base.raw"}}
json:{"driver":"qcow2","file":{"driver":"file","filename":"base.qcow2"},"backing":null}
json:{"driver":"raw","offset":512,"size":262144,"file":{"driver":"file","filename":"disk.img"}}
json:{"driver":"raw","file":{"filename":"nbd://host/x"}}
json:{"driver":"raw","file":{"driver":"nbd","server":{"type":"inet","host":"h","port":"1"},"tls-creds":"t"}}
json:{"driver":"raw","file":{"driver":"gluster","volume":"v","path":"p"}}
json:{"driver":"raw","file":"node0"}
json:{"a":"\u0041\u00e9\ud83d\ude00\n\"\\\/","b":[1,2.5e3,-0,true,false,null,{"c":{}}],"driver":"raw","file":{"driver":"file","filename":"x"}}
json:{"driver":"raw","driver":"qcow2"}
json:{"driver":"raw","file":{"driver":"file","filename":"x"}} trailing
/dir/top.qcow2 => base.raw
http://host/dir/mid.qcow2 => base.raw
http://host/dir/mid.qcow2 => ../other/base.qcow2
ssh://host/srv/mid.qcow2?host_key_check=no => base.raw
nbd://host/export => base.raw
json:{"driver":"qcow2","file":{"driver":"http","url":"http://host/d/mid.qcow2"}} => base.raw
file:/dir/x.qcow2 => base.raw
NAMES
  ls corpus-names | wc -l
  exit
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# The harness's control word bits (fuzz-qcow2.c).
CACHE_1K=1 SLICE_512=$((1 << 2)) NO_BACKING=$((1 << 4)) READONLY=$((1 << 5))
DISCARD_IGNORE=$((1 << 6)) SNAP_NAME=$((1 << 7)) SNAP_ID=$((2 << 7))
CHUNK_SMALL=$((1 << 10)) CHUNK_ODD=$((3 << 10)) PREALLOC=$((1 << 12))
OVERLAP_NONE=$((1 << 14)) OVERLAP_ALL=$((3 << 14))

create () { qemu-img create -q -f qcow2 "$@"; }
io () { local f=$1; shift; qemu-io -f qcow2 "${@/#/-c}" "$f" >/dev/null; }

# Copy image $1 into the corpus as $2 with control word $3 (plus a
# seed in the high bits, so that seeds differ in their requests too).
seed () {
  local ctl=$(( $3 | ($(printf %s "$2" | cksum | cut -d' ' -f1) << 16) ))
  {
    cat "$1"
    for i in 0 1 2 3 4 5 6 7; do
      printf "\\$(printf %03o $(( (ctl >> (8 * i)) & 255 )))"
    done
  } > "$out/$2"
}

rm -f "$out"/*.qcow2 "$out"/*.tpl "$out"/*.crt
mkdir -p "$out"
qemu-img create -q -f raw base.raw 192K

create -o compat=0.10,cluster_size=512 v2.qcow2 1M
io v2.qcow2 'write -P 0x11 0 1536' 'write -P 0x22 4096 512' \
   'write -P 0x23 700000 3000'
seed v2.qcow2 v2-512.qcow2 0
seed v2.qcow2 v2-512-smallcache.qcow2 $((CACHE_1K | SLICE_512 | CHUNK_ODD))
seed v2.qcow2 v2-512-overlap-none.qcow2 $OVERLAP_NONE

create -o cluster_size=4096 v3.qcow2 2M
io v3.qcow2 'write -P 0x31 0 12k' 'write -z 16k 8k' 'write -P 0x32 40k 6k' \
   'discard 4k 4k' 'write -z -u 44k 4k'
seed v3.qcow2 v3-4k.qcow2 0
seed v3.qcow2 v3-4k-discard-ignore.qcow2 $((DISCARD_IGNORE | CHUNK_SMALL))
seed v3.qcow2 v3-4k-overlap-all.qcow2 $OVERLAP_ALL

create -o cluster_size=4096,refcount_bits=1 rc1.qcow2 1M
io rc1.qcow2 'write -P 0x41 4k 8k'
seed rc1.qcow2 v3-4k-refcount1.qcow2 0

create -o cluster_size=512,refcount_bits=64 rc64.qcow2 1M
io rc64.qcow2 'write -P 0x42 0 40k'
seed rc64.qcow2 v3-512-refcount64.qcow2 0

# The default cluster size: the only seed over 64 KiB with extl2-16k.
create v3-64k.qcow2 1M
seed v3-64k.qcow2 v3-64k-empty.qcow2 $CHUNK_SMALL

create -o cluster_size=16384,extended_l2=on extl2.qcow2 1M
io extl2.qcow2 'write -P 0x51 512 1024' 'write -z 2048 1024' \
   'write -z 16k 16k'
seed extl2.qcow2 extl2-16k.qcow2 0

create -o cluster_size=4096 zlib.qcow2 256K
io zlib.qcow2 'write -c -P 0x61 0 4k' 'write -c -P 0x62 8k 8k' \
   'write -P 0x63 20k 1k'
seed zlib.qcow2 zlib-4k.qcow2 0

create -o cluster_size=4096,compression_type=zstd zstd.qcow2 256K
io zstd.qcow2 'write -c -P 0x71 0 4k' 'write -c -P 0x72 12k 4k'
seed zstd.qcow2 zstd-4k.qcow2 0

create -o cluster_size=512 -b base.raw -F raw over-raw.qcow2 256K
io over-raw.qcow2 'write -P 0x81 100 200' 'write -z 4096 1024' \
   'write -P 0x82 200000 512'
seed over-raw.qcow2 backing-raw-512.qcow2 0
seed over-raw.qcow2 backing-raw-512-nobacking.qcow2 $NO_BACKING

create -o cluster_size=512,compat=0.10 -u -b base.qcow2 -F qcow2 \
  over-qcow2.qcow2 256K
seed over-qcow2.qcow2 backing-qcow2-512.qcow2 0

# Names itself: the chain loops.
create -o cluster_size=512 -u -b disk.qcow2 -F qcow2 loop.qcow2 64K
seed loop.qcow2 backing-loop.qcow2 0

create -o cluster_size=512 snap.qcow2 128K
io snap.qcow2 'write -P 0x91 0 2k'
qemu-img snapshot -c snap1 snap.qcow2
io snap.qcow2 'write -P 0x92 1k 2k'
qemu-img snapshot -c snap2 snap.qcow2
seed snap.qcow2 snapshot-512.qcow2 0
seed snap.qcow2 snapshot-512-snap1.qcow2 $SNAP_NAME
seed snap.qcow2 snapshot-512-id1.qcow2 $((SNAP_ID | READONLY))

create -o compat=0.10,cluster_size=512 snapv2.qcow2 64K
io snapv2.qcow2 'write -P 0x93 512 1k'
qemu-img snapshot -c snap1 snapv2.qcow2
seed snapv2.qcow2 snapshot-v2-512.qcow2 0

create -o cluster_size=4096 bitmaps.qcow2 256K
io bitmaps.qcow2 'write -P 0xa1 0 8k'
qemu-img bitmap --add bitmaps.qcow2 b0
qemu-img bitmap --add --granularity 8k bitmaps.qcow2 b1
qemu-img bitmap --disable bitmaps.qcow2 b1
seed bitmaps.qcow2 bitmaps-4k.qcow2 0
# Enabled bitmaps with data, kept up to date by writes (512-byte and
# 64 KiB granularity, a table of several clusters), and one in use.
create -o cluster_size=512 bitmaps512.qcow2 4M
qemu-img bitmap --add --granularity 512 bitmaps512.qcow2 fine
io bitmaps512.qcow2 'write -P 0xa2 0 4k'
(ulimit -c 0; qemu-io -f qcow2 -c "write -P 0xa3 3M 1536" -c abort \
  bitmaps512.qcow2; true) >/dev/null 2>&1 || true
qemu-img bitmap --add --granularity 64k bitmaps512.qcow2 coarse
io bitmaps512.qcow2 'write -P 0xa4 1M 4k'
seed bitmaps512.qcow2 bitmaps-512.qcow2 0

create -o cluster_size=4096,data_file=data.raw datafile.qcow2 64K
io datafile.qcow2 'write -P 0xb1 4k 4k'
seed datafile.qcow2 datafile-4k.qcow2 0
create -o cluster_size=4096,data_file=data.raw,data_file_raw=on \
  datafile-raw.qcow2 64K
seed datafile-raw.qcow2 datafile-raw-4k.qcow2 0

# Left dirty by a crash under lazy refcounts: repaired on first write.
create -o cluster_size=512,lazy_refcounts=on lazy.qcow2 64K
(ulimit -c 0; qemu-io -f qcow2 -c "write -P 0xc1 0 4k" -c abort lazy.qcow2; true) \
  >/dev/null 2>&1 || true
seed lazy.qcow2 lazy-dirty-512.qcow2 0

qemu-img create -q -f qcow2 -o cluster_size=512,preallocation=metadata \
  prealloc.qcow2 32K
seed prealloc.qcow2 prealloc-512.qcow2 0

create -o cluster_size=512 empty.qcow2 64K
seed empty.qcow2 empty-512-prealloc.qcow2 $PREALLOC

# Inputs of the other kinds (fuzz-qcow2.c): the harness's LUKS
# templates with patches to their LUKS headers, key slots and
# encryption header extension; create options.  Each with a control
# word as seed () gives one.
/usr/bin/python3 - "$out" <<'PYEOF'
import os, struct, sys, zlib
out = sys.argv[1]
READONLY, PREALLOC, FULL = 1 << 5, 1 << 12, 1 << 13
def write(name, body, ctl):
    ctl |= (zlib.crc32(name.encode()) & 0xffffffff) << 16
    with open(os.path.join(out, name), "wb") as f:
        f.write(body + struct.pack("<Q", ctl))
def rec(off, data, luks=True):
    return struct.pack("<BIB", 1 if luks else 0, off, len(data)) + data
def truncate(size):
    return struct.pack("<BIB", 2, size, 0)
def tpl(name, t, records=b"", ctl=0):
    write(name, b"\0TPL" + bytes([t]) + records, ctl)
be32 = lambda v: struct.pack(">I", v)
SLOT = lambda i, field: 208 + 48 * i + field
tpl("luks-aes-xts-512.tpl", 0)
tpl("luks-cast5-cbc-essiv-4k.tpl", 1)
tpl("luks-serpent-ecb-datafile.tpl", 2)
tpl("luks-aes-xts-512-readonly.tpl", 0, ctl=READONLY)
tpl("luks-cast5-prealloc.tpl", 1, ctl=PREALLOC | FULL)
tpl("luks-slot0-stripes.tpl", 0, rec(SLOT(0, 44), be32(4001)))
tpl("luks-slot0-material-outside.tpl", 0, rec(SLOT(0, 40), be32(0x0fffffff)))
tpl("luks-slot0-material-on-header.tpl", 1, rec(SLOT(0, 40), be32(1)))
tpl("luks-slot0-iterations.tpl", 0, rec(SLOT(0, 4), be32(0xffffffff)))
tpl("luks-mk-iterations-0.tpl", 2, rec(164, be32(0)))
tpl("luks-slot1-active.tpl", 1, rec(SLOT(1, 0), be32(0x00AC71F3)))
tpl("luks-mode.tpl", 0, rec(40, b"cbc-essiv:sha256\0"))
tpl("luks-hash.tpl", 1, rec(72, b"ripemd160\0"))
tpl("luks-cipher.tpl", 2, rec(8, b"twofish\0"))
tpl("luks-key-bytes.tpl", 0, rec(108, be32(24)))
tpl("luks-magic.tpl", 1, rec(0, b"LUKS\xba\xbf"))
# The encryption header extension (the first, at 112: offset, length).
tpl("luks-ext-length-past-eof.tpl", 0, rec(128, struct.pack(">Q", 1 << 22), False))
tpl("luks-ext-offset.tpl", 1, rec(120, struct.pack(">Q", 4096 + 512), False))
tpl("luks-truncated.tpl", 2, truncate(20000))
tpl("luks-crypt-method.tpl", 0, rec(32, be32(1), False))

# Create options: cluster size (log2), size / 64 (24-bit), flags,
# refcount width, backing, preallocation, LUKS choices, no password.
def crt(name, cbits, size, flags=0, rc=0, backing=0, prealloc=0,
        luks=(0, 0, 0, 0, 0), nopw=0):
    body = bytes([cbits]) + struct.pack("<I", size // 64)[:3] + \
        bytes([flags, rc, backing, prealloc]) + bytes(luks) + bytes([nopw])
    write(name, b"\0CRT" + body, 0)
crt("create-64k.crt", 16, 1 << 20)
crt("create-512-v2.crt", 9, 300 << 10, flags=1)
crt("create-extl2-32k-prealloc.crt", 15, (1 << 20) - 512, flags=2, prealloc=1)
crt("create-extl2-4k.crt", 12, 1 << 20, flags=2)
crt("create-lazy-zstd-rc1.crt", 12, 512 << 10, flags=4 | 8, rc=1, prealloc=3)
crt("create-rc3.crt", 12, 64 << 10, rc=3)
crt("create-datafile-raw.crt", 12, 64 << 10, flags=16 | 32, prealloc=1)
crt("create-datafile-falloc.crt", 12, 48 << 10, flags=16, prealloc=2)
crt("create-backing-qcow2-extl2.crt", 14, 256 << 10, flags=2 | 64, prealloc=1)
crt("create-backing-raw.crt", 9, 192 << 10, flags=64, backing=1)
crt("create-backing-noformat.crt", 9, 192 << 10, flags=64, backing=2)
crt("create-backing-prealloc.crt", 16, 256 << 10, flags=64, prealloc=3)
crt("create-backing-long-name.crt", 9, 64 << 10, flags=64, backing=4)
crt("create-cluster-3000.crt", 23, 1 << 20)
crt("create-too-large.crt", 9, (1 << 24) * 64 - 64)
crt("create-luks.crt", 16, 1 << 20, flags=128)
crt("create-luks-cbc-essiv.crt", 16, 1 << 20, flags=128, luks=(3, 1, 2, 1, 5))
crt("create-luks-bad.crt", 16, 1 << 20, flags=128, luks=(10, 4, 3, 7, 7))
crt("create-luks-nopw.crt", 16, 1 << 20, flags=128, nopw=1)
crt("create-luks-raw-datafile.crt", 12, 1 << 20, flags=128 | 16 | 32)
PYEOF

ls -l "$out"
du -sh "$out"
