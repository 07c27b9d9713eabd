#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Remote pieces in flight together, shown by a server that answers no
# read of a group until the group's reads all arrived (nbdkit's sh
# plugin, a rendezvous in a folder): read in turn, the first would wait
# for ever (and fail after 10 s).  A 1 MiB read of an overlay whose
# every other cluster is its own (8 pieces from the raw base); a read
# of a qcow2 base whose clusters lie in reverse (8 pieces in its file);
# 16 reads from a client at once (16 pieces).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

# The bytes of $FILE; reads at offsets from $FROM on meet in groups of
# $N by the 16 MiB they fall in ($N_1 for the second), under $DIR.
cat > "$tmp/rendezvous.sh" <<'SH'
#!/usr/bin/env bash
case "$1" in
  thread_model) echo parallel ;;
  get_size) stat -L -c %s "$FILE" ;;
  pread)
    count=$3 offset=$4
    if [ "$offset" -ge "$FROM" ]; then
      group=$((offset >> 24)) n=$N
      [ "$group" -eq 0 ] || n=$N_1
      mkdir -p "$DIR/$group"
      touch "$DIR/$group/$offset"
      for i in $(seq 200); do
        [ "$(ls "$DIR/$group" | wc -l)" -ge "$n" ] && break
        sleep 0.05
      done
      [ "$(ls "$DIR/$group" | wc -l)" -ge "$n" ] ||
        { echo "EIO the reads of group $group came in turn" >&2; exit 1; }
    fi
    dd if="$FILE" bs=64k iflag=skip_bytes,count_bytes skip="$offset" \
      count="$count" status=none ;;
  *) exit 2 ;;
esac
SH
chmod +x "$tmp/rendezvous.sh"

# rendezvous NAME FILE FROM N N_1: the server of FILE on $tmp/NAME.sock.
rendezvous ()
{
  mkdir "$tmp/$1.d"
  DIR=$tmp/$1.d FILE=$2 FROM=$3 N=$4 N_1=$5 \
    nbd_server "$1" -r sh "$tmp/rendezvous.sh"
}

# The raw base: 8 pieces of a fragmented read, then 16 client reads.
qemu-img create -q -f raw "$tmp/base.raw" 32M
QIO_FMT=raw qio "$tmp/base.raw" 'write -P 0x11 0 32M'
rendezvous raw "$tmp/base.raw" 0 8 16
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/raw.sock" -F raw \
  "$tmp/ovl.qcow2"
qio "$tmp/ovl.qcow2" 'write -P 0x22 0 64k' 'write -P 0x22 128k 64k' \
  'write -P 0x22 256k 64k' 'write -P 0x22 384k 64k' 'write -P 0x22 512k 64k' \
  'write -P 0x22 640k 64k' 'write -P 0x22 768k 64k' 'write -P 0x22 896k 64k'
timeout 60 nbdkit -U - qcow2 "$tmp/ovl.qcow2" --run 'nbdsh -u "$uri" -c "
d = h.pread(1 << 20, 0)
for i in range(16):
    assert d[i << 16:(i + 1) << 16] == (b\"\\x22\" if i % 2 == 0 else b\"\\x11\") * 65536, i
cookies = [h.aio_pread(nbd.Buffer(4096), (16 << 20) + (i << 20)) for i in range(16)]
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cookies:
    assert h.aio_command_completed(c)
"' || fail "the pieces of a read, or reads at once, were not in flight together"
[ "$(ls "$tmp/raw.d/0" | wc -l)" -eq 8 ] || fail "not 8 pieces: $(ls "$tmp/raw.d/0")"

# A qcow2 base (on the server) whose 8 clusters lie in reverse in its
# file, after its metadata: one read of them has 8 pieces.
qemu-img create -q -f qcow2 "$tmp/rev.qcow2" 1M
qio "$tmp/rev.qcow2" 'write -P 0x37 448k 64k' 'write -P 0x36 384k 64k' \
  'write -P 0x35 320k 64k' 'write -P 0x34 256k 64k' 'write -P 0x33 192k 64k' \
  'write -P 0x32 128k 64k' 'write -P 0x31 64k 64k' 'write -P 0x30 0 64k'
first=$(qemu-img map --output=json -f qcow2 "$tmp/rev.qcow2" |
  /usr/bin/python3 -c 'import json, sys; print(min(e["offset"] for e in json.load(sys.stdin) if "offset" in e))')
rendezvous rev "$tmp/rev.qcow2" "$first" 8 8
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/rev.sock" -F qcow2 \
  "$tmp/top.qcow2"
timeout 60 nbdkit -U - qcow2 "$tmp/top.qcow2" --run 'nbdsh -u "$uri" -c "
d = h.pread(512 << 10, 0)
for i in range(8):
    assert d[i << 16:(i + 1) << 16] == bytes([0x30 + i]) * 65536, i
"' || fail "the pieces of a read of a remote qcow2 base were not in flight together"
