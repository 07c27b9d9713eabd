#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# LUKS: the ways of giving the password (password=SECRET, +FILE, -FD,
# and - typed on a terminal),
# key slots other than the first (added and removed by qemu-img amend),
# and every refusal with its message: no password, a wrong one, QEMU's
# legacy AES method, a LUKS header or key slot that is corrupt, create
# options that QEMU could not open, and a data write that would land on
# the LUKS header (the overlap guard).
source "${srcdir:-.}/write-functions.sh"
set -e

M=1048576
pw=s3cret

img=$tmp/img.qcow2
qemu_img_pbkdf create -q -f qcow2 --object "secret,id=sec0,data=$pw" \
  -o encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10 \
  "$img" 4M || fail "qemu-img create"
qemu-io --object "secret,id=sec0,data=$pw" --image-opts \
  "driver=qcow2,file.filename=$img,encrypt.key-secret=sec0" \
  -c "write -P 0x42 0 64k" >/dev/null || fail "qemu-io write"

# reads_42 ARGS...: the image opens with ARGS and reads what qemu wrote.
reads_42 ()
{
  nbdkit -U - qcow2 "file=$img" "$@" --run '
    nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\x42\" * 65536"' ||
    fail "reading with $*"
}
reads_42 "password=$pw"
printf '%s' "$pw" > "$tmp/pw"
reads_42 "password=+$tmp/pw"
reads_42 password=-3 3< "$tmp/pw"

# typed PASSWORD ARGS...: nbdkit ARGS on a terminal of its own (a
# pseudo-terminal), PASSWORD typed when it asks; its output in
# $tmp/typed.out, its exit status returned.
typed ()
{
  /usr/bin/python3 - "$@" > "$tmp/typed.out" <<'EOF'
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execvp("timeout", ["timeout", "--foreground", "120", "nbdkit"] + sys.argv[2:])
out, typed = b"", False
while True:
    try:
        data = os.read(fd, 4096)
    except OSError:              # the terminal closed: nbdkit exited
        break
    if not data:
        break
    out += data
    if not typed and b"password:" in out.lower():
        os.write(fd, sys.argv[1].encode() + b"\n")
        typed = True
sys.stdout.write(out.decode(errors="replace"))
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
EOF
}
typed "$pw" -U - qcow2 "file=$img" password=- --run '
  nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\x42\" * 65536"' || {
  cat "$tmp/typed.out"; fail "password=- typed on the terminal"; }
! typed wrong -U - qcow2 "file=$img" password=- --run true ||
  fail "a wrong password typed on the terminal was taken"
grep -q "wrong password" "$tmp/typed.out" || {
  cat "$tmp/typed.out"; fail "no 'wrong password' after a wrong one was typed"; }

expect_refused "give its password with password=" qcow2 "file=$img"
expect_refused "wrong password: it opens none of the image's 1 active" \
  qcow2 "file=$img" password=wrong
expect_refused "wrong password" qcow2 "file=$img" "password=${pw}x"

# Another key slot: qemu-img amend adds a password in slot 3, then
# removes slot 0.
qemu_img_pbkdf amend --object "secret,id=sec0,data=$pw" \
  --object secret,id=sec1,data=other --image-opts \
  -o encrypt.state=active,encrypt.new-secret=sec1,encrypt.keyslot=3,encrypt.iter-time=10 \
  "driver=qcow2,file.filename=$img,encrypt.key-secret=sec0" || fail "qemu-img amend"
reads_42 password=other
reads_42 "password=$pw"
qemu-img amend --object "secret,id=sec1,data=other" --image-opts \
  -o encrypt.state=inactive,encrypt.keyslot=0 \
  "driver=qcow2,file.filename=$img,encrypt.key-secret=sec1" ||
  fail "qemu-img amend (removing slot 0)"
reads_42 password=other
expect_refused "wrong password" qcow2 "file=$img" "password=$pw"

# Corrupt headers: the LUKS magic, a key slot's stripes, the extension.
crypto_off=$(/usr/bin/python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(65536)
off = struct.unpack(">I", b[100:104])[0]
while off + 8 <= len(b):
    t, n = struct.unpack(">II", b[off:off + 8])
    if t == 0x0537be77:
        print(struct.unpack(">Q", b[off + 8:off + 16])[0]); break
    if t == 0: break
    off += 8 + (n + 7) // 8 * 8
' "$img")
[ -n "$crypto_off" ] || fail "no encryption header extension found"
cp "$img" "$tmp/bad.qcow2"
printf 'XUKS' | dd of="$tmp/bad.qcow2" bs=1 seek="$crypto_off" conv=notrunc status=none
expect_refused "encryption header at $(printf '%#x' "$crypto_off") is not a LUKS1 header" \
  qcow2 "file=$tmp/bad.qcow2" password=other
cp "$img" "$tmp/bad.qcow2"
# the cipher mode field (header offset 40): "gcm-plain64"
printf 'gcm-plain64\0' |
  dd of="$tmp/bad.qcow2" bs=1 seek=$((crypto_off + 40)) conv=notrunc status=none
expect_refused "LUKS header: cipher mode \"gcm-plain64\", hash \"sha256\": the cipher mode \(ecb, cbc, xts, ctr are\) not supported" \
  qcow2 "file=$tmp/bad.qcow2" password=other
cp "$img" "$tmp/bad.qcow2"
# slot 3's stripes (header 208 + 3 * 48 + 44), 4000 -> 4001
printf '\x00\x00\x0f\xa1' |
  dd of="$tmp/bad.qcow2" bs=1 seek=$((crypto_off + 208 + 3 * 48 + 44)) conv=notrunc status=none
expect_refused "LUKS key slot 3 is corrupt: 4001 stripes, not 4000$" \
  qcow2 "file=$tmp/bad.qcow2" password=other
cp "$img" "$tmp/bad.qcow2"
# slot 3's key material offset (header 208 + 3 * 48 + 40), in sectors:
# far past the encryption header
printf '\x00\x10\x00\x00' |
  dd of="$tmp/bad.qcow2" bs=1 seek=$((crypto_off + 208 + 3 * 48 + 40)) conv=notrunc status=none
expect_refused "LUKS key slot 3 is corrupt: its key material \(256000 bytes at 0x20000000\) lies outside the encryption header \([0-9]+ bytes\)$" \
  qcow2 "file=$tmp/bad.qcow2" password=other
qemu-io --object secret,id=sec1,data=other --image-opts \
  "driver=qcow2,file.filename=$tmp/bad.qcow2,encrypt.key-secret=sec1" \
  -c "read 0 512" > /dev/null 2>&1 && fail "qemu-io opens a key slot outside the header"
# An encryption header extension whose length runs past the end of the
# file: QEMU opens the image (it reads the LUKS header and key
# material only), and so do we.
cp "$img" "$tmp/long.qcow2"
/usr/bin/python3 - "$tmp/long.qcow2" <<'EOF'
import os, struct, sys
f = open(sys.argv[1], "r+b")
b = f.read(65536)
off = struct.unpack(">I", b[100:104])[0]
while True:
    t, n = struct.unpack(">II", b[off:off + 8])
    if t == 0x0537be77:
        break
    off += 8 + (n + 7) // 8 * 8
f.seek(off + 16)
f.write(struct.pack(">Q", os.path.getsize(sys.argv[1]) * 4))
EOF
qemu-io --object secret,id=sec1,data=other --image-opts \
  "driver=qcow2,file.filename=$tmp/long.qcow2,encrypt.key-secret=sec1" \
  -c "read -P 0x42 0 64k" > /dev/null ||
  fail "qemu-io does not open an encryption header running past the file"
nbdkit -U - -r qcow2 "file=$tmp/long.qcow2" password=other --run '
  nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\x42\" * 65536"' ||
  fail "an encryption header running past the end of the file"

# QEMU's legacy AES (crypt_method 1), as an old qemu-img made it: a
# plain image with the method set.
qemu-img create -q -f qcow2 "$tmp/aes.qcow2" 1M
printf '\x00\x00\x00\x01' | dd of="$tmp/aes.qcow2" bs=1 seek=32 conv=notrunc status=none
expect_refused "legacy AES method \(crypt_method 1 at header offset 0x20\) is not supported$" \
  qcow2 "file=$tmp/aes.qcow2" password=x
grep -q "^nbdkit: error: hint: convert the image to LUKS: qemu-img convert .*encrypt.format=luks" \
  "$tmp/refused.err" || fail "legacy AES: no remedy in a hint"
printf '\x00\x00\x00\x07' | dd of="$tmp/aes.qcow2" bs=1 seek=32 conv=notrunc status=none
expect_refused "unknown encryption method 7" qcow2 "file=$tmp/aes.qcow2"

# Create options.
expect_refused "encrypt-format=luks needs a password" \
  qcow2 "file=$tmp/n1.qcow2" create=true size=1M encrypt-format=luks
[ ! -e "$tmp/n1.qcow2" ] || fail "a refused create left a file behind"
expect_refused "encrypt-\* keys describe encryption: they need encrypt-format=luks" \
  qcow2 "file=$tmp/n2.qcow2" create=true size=1M encrypt-cipher-alg=aes-128
expect_refused "QEMU cannot open an image whose key material is not whole sectors" \
  qcow2 "file=$tmp/n3.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-cipher-alg=aes-192 encrypt-cipher-mode=cbc
expect_refused "XTS needs a cipher with 16-byte blocks" \
  qcow2 "file=$tmp/n4.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-cipher-alg=cast5-128
expect_refused "encrypt-cipher-alg=aes-512 is not supported" \
  qcow2 "file=$tmp/n5.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-cipher-alg=aes-512
expect_refused "^nbdkit: error: encrypt-cipher-mode=gcm is not supported \(ecb, cbc, xts, ctr are\)$" \
  qcow2 "file=$tmp/n7.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-cipher-mode=gcm
expect_refused "^nbdkit: error: encrypt-ivgen-alg=benbi is not supported \(plain, plain64, essiv are\)$" \
  qcow2 "file=$tmp/n7.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-ivgen-alg=benbi
expect_refused "^nbdkit: error: encrypt-hash-alg=md4 is not supported \(md5, sha1, sha224, sha256, sha384, sha512, ripemd160 are\)$" \
  qcow2 "file=$tmp/n7.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-hash-alg=md4
expect_refused "^nbdkit: error: encrypt-ivgen-hash-alg=crc32 is not supported \(md5, sha1, " \
  qcow2 "file=$tmp/n7.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-ivgen-alg=essiv encrypt-ivgen-hash-alg=crc32
expect_refused "^nbdkit: error: encrypt-ivgen-hash-alg=crc32 is not supported \(md5, sha1, " \
  qcow2 "file=$tmp/n7.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-ivgen-hash-alg=crc32
expect_refused "encrypted image's data file cannot be raw" \
  qcow2 "file=$tmp/n6.qcow2" create=true size=1M encrypt-format=luks \
  password=x data-file="$tmp/n6.data" data-file-raw=true
# A PBKDF2 time that needs more iterations than a key slot counts:
# refused at once, before the file is touched, as qemu-img refuses it
# ("PBKDF iterations ... larger than 4294967295"), not run for hours.
TEST_TIMEOUT=30 expect_refused \
  "encrypt-iter-time=100000000000 would take [0-9]+ PBKDF2 iterations on this machine, more than a LUKS key slot counts \(4294967295\)" \
  qcow2 "file=$tmp/n8.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-iter-time=100000000000
TEST_TIMEOUT=30 expect_refused "would take over 18446744073709551615 PBKDF2 iterations" \
  qcow2 "file=$tmp/n9.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-iter-time=18446744073709551615
for f in n1 n2 n3 n4 n5 n6 n7 n8 n9; do
  [ ! -e "$tmp/$f.qcow2" ] || fail "a refused create left $f.qcow2 behind"
done

# The overlap guard keeps data off the LUKS header: an L2 entry
# pointing into it, then a write there, is refused and marks the image
# corrupt; the key material is unchanged and still opens.
nbdkit -U - qcow2 "file=$tmp/g.qcow2" create=true size=4M encrypt-format=luks \
  password=pw encrypt-iter-time=10 cluster-size=64k --run '
  nbdsh -u "$uri" -c "h.pwrite(b\"\x01\" * 65536, 0); h.flush()"' ||
  fail "create=true for the guard test"
g_crypto=$(/usr/bin/python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(65536)
l1 = struct.unpack(">Q", b[40:48])[0]
f = open(sys.argv[1], "r+b")
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
off = struct.unpack(">I", b[100:104])[0]
while True:
    t, n = struct.unpack(">II", b[off:off + 8])
    if t == 0x0537be77:
        crypto = struct.unpack(">Q", b[off + 8:off + 16])[0]; break
    off += 8 + (n + 7) // 8 * 8
f.seek(l2); f.write(struct.pack(">Q", crypto | (1 << 63)))
print(crypto)
' "$tmp/g.qcow2")
before=$(dd if="$tmp/g.qcow2" bs=64k skip=$((g_crypto / 65536)) count=33 status=none | md5sum)
nbdkit -U - qcow2 "file=$tmp/g.qcow2" password=pw --run '
  nbdsh -u "$uri" -c "
try:
    h.pwrite(b\"\x02\" * 512, 0)
    raise SystemExit(\"write onto the LUKS header succeeded\")
except nbd.Error:
    pass
"' 2> "$tmp/guard.err" || { cat "$tmp/guard.err"; fail "guard test"; }
grep -q "would overwrite the encryption header (LUKS)" "$tmp/guard.err" || {
  cat "$tmp/guard.err"; fail "the guard did not name the LUKS header"; }
after=$(dd if="$tmp/g.qcow2" bs=64k skip=$((g_crypto / 65536)) count=33 status=none | md5sum)
[ "$before" = "$after" ] || fail "the LUKS header changed"
[ "$(header_flags "$tmp/g.qcow2")" = "0 1" ] || fail "the image is not marked corrupt"
echo "password forms, key slots, refusals and the guard: OK"
