#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# LUKS passwords as QEMU users have them:
#  - a secret file made with echo, which QEMU's --object secret,file=
#    reads with its trailing newline: password=+FILE opens the image
#    (nbdkit reads the first line, so the whole file is tried too), and
#    a wrong one says that both were tried; password=-FD too;
#  - a password per layer (libvirt gives each volume its own secret):
#    an overlay and its backing file with different passwords, served
#    with password= and backing-password= (the plugin) or
#    qcow2-password= and qcow2-backing-password= (the filter), a chain
#    of three, a layer past the passwords given taking the last one,
#    a wrong one for a backing file naming the key for it;
#  - passphrase= (as nbdkit's luks filter names it) and the filter's
#    qcow2-passphrase=;
#  - a password given where no layer is encrypted: refused.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

cd "$tmp"
luks=encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10

# An image QEMU made with a secret file ending in a newline.
echo "file-secret" > echo.pw
qemu_img_pbkdf create -q -f qcow2 --object secret,id=sec0,file=echo.pw \
  -o "$luks" nl.qcow2 1M || fail "qemu-img create with secret,file="
qemu-io --object secret,id=sec0,file=echo.pw --image-opts \
  "driver=qcow2,file.filename=nl.qcow2,encrypt.key-secret=sec0" \
  -c "write -P 0x4e 0 64k" > /dev/null || fail "qemu-io with secret,file="
nbdkit -U - qcow2 nl.qcow2 password=+echo.pw --run '
  nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\x4e\" * 65536"' ||
  fail "password=+FILE with the trailing newline QEMU keeps"
echo "other" > other.pw
expect_refused "wrong password: it opens none of the image's 1 active LUKS key slots \(nor does the whole file it was read from, as QEMU reads a secret file\)" \
  qcow2 nl.qcow2 password=+other.pw
# The same file on a descriptor (-FD): nbdkit takes the newline off,
# and it is tried with it too.
nbdkit -U - qcow2 nl.qcow2 password=-3 3< echo.pw --run '
  nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\x4e\" * 65536"' ||
  fail "password=-FD with the trailing newline QEMU keeps"

# Layers with passwords of their own: base (pw-base), mid over it
# (pw-mid), top over mid (pw-top), each with data of its own.  Made by
# us (qemu-img takes seconds to count PBKDF2 iterations), each with its
# backing file's password.
qsec () { echo "secret,id=$1,data=$2"; }
ours=(encrypt-format=luks encrypt-iter-time=10)
nbdkit -U - qcow2 base.qcow2 create=true size=2M "${ours[@]}" \
  password=pw-base --run true || fail "create=true base"
nbdkit -U - qcow2 mid.qcow2 create=true backing=base.qcow2 "${ours[@]}" \
  password=pw-mid backing-password=pw-base --run true ||
  fail "create=true mid, over an encrypted backing file"
nbdkit -U - qcow2 top.qcow2 create=true backing=mid.qcow2 "${ours[@]}" \
  password=pw-top backing-password=pw-mid backing-password=pw-base \
  --run true || fail "create=true top"
chain_opts="driver=qcow2,file.filename=top.qcow2,encrypt.key-secret=st"
chain_opts+=",backing.encrypt.key-secret=sm"
chain_opts+=",backing.backing.encrypt.key-secret=sb"
chain_objs=(--object "$(qsec st pw-top)" --object "$(qsec sm pw-mid)"
            --object "$(qsec sb pw-base)")
qemu-io --object "$(qsec sb pw-base)" --image-opts \
  "driver=qcow2,file.filename=base.qcow2,encrypt.key-secret=sb" \
  -c "write -P 0xb1 0 1M" > /dev/null || fail "writing base"
qemu-io --object "$(qsec sm pw-mid)" --object "$(qsec sb pw-base)" \
  --image-opts "driver=qcow2,file.filename=mid.qcow2,encrypt.key-secret=sm,backing.encrypt.key-secret=sb" \
  -c "write -P 0xa2 512k 512k" > /dev/null || fail "writing mid"
qemu-io "${chain_objs[@]}" --image-opts "$chain_opts" \
  -c "write -P 0x73 768k 64k" > /dev/null || fail "writing top"
qemu-img convert "${chain_objs[@]}" --image-opts "$chain_opts" -O raw chain.raw

# reads_chain ARGS...: the chain served with ARGS reads as QEMU reads it.
reads_chain ()
{
  rm -f out.raw
  nbdkit -U - "$@" --run 'nbdcopy "$uri" out.raw' ||
    fail "serving the chain: $*"
  cmp chain.raw out.raw || fail "the chain served with $* differs from qemu's"
}
reads_chain qcow2 top.qcow2 password=pw-top backing-password=pw-mid \
  backing-password=pw-base
reads_chain qcow2 top.qcow2 passphrase=pw-top backing-passphrase=pw-mid \
  backing-passphrase=pw-base
# In any order: password= is always the image's own.
reads_chain qcow2 top.qcow2 backing-password=pw-mid password=pw-top \
  backing-password=pw-base
reads_chain --filter=qcow2 file top.qcow2 qcow2-password=pw-top \
  qcow2-backing-password=pw-mid qcow2-backing-password=pw-base
reads_chain --filter=qcow2 file top.qcow2 qcow2-passphrase=pw-top \
  qcow2-backing-passphrase=pw-mid qcow2-backing-passphrase=pw-base
# Writes go to the top only, with its own key; QEMU reads them.
nbdkit -U - qcow2 top.qcow2 password=pw-top backing-password=pw-mid \
  backing-password=pw-base --run '
  nbdsh -u "$uri" -c "h.pwrite(b\"\x5a\" * 4096, 1024 * 1024 - 4096); h.flush()"' ||
  fail "writing the top of the chain"
qemu-io "${chain_objs[@]}" --image-opts "$chain_opts" \
  -c "read -P 0x5a 1020k 4k" -c "read -P 0xa2 512k 256k" \
  -c "read -P 0x73 768k 64k" -c "read -P 0xb1 0 512k" > /dev/null ||
  fail "qemu-io reading the chain after our write"
qemu-img check -q "${chain_objs[@]}" --image-opts "$chain_opts" ||
  fail "qemu-img check of the chain"

# A layer past the passwords given takes the last one: one password
# for a whole chain; with too few, the layer left out is named.
nbdkit -U - qcow2 s-base.qcow2 create=true size=1M "${ours[@]}" \
  password=shared --run true || fail "create=true s-base"
nbdkit -U - qcow2 s-top.qcow2 create=true backing=s-base.qcow2 \
  "${ours[@]}" password=shared --run 'nbdinfo --size "$uri"' > /dev/null ||
  fail "one password for a whole chain"
expect_refused "base.qcow2: wrong password" \
  qcow2 top.qcow2 password=pw-top backing-password=pw-mid
grep -q "^nbdkit: error: hint: a backing file's own password is given with backing-password=" \
  "$tmp/refused.err" || fail "wrong backing password: no remedy"
# The filter opens the image once nbdkit runs: no client is served.
nbdkit -U - --filter=qcow2 file top.qcow2 qcow2-password=pw-top \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> filter.err &&
  fail "the filter served a chain with the wrong backing password"
grep -q "mid.qcow2: wrong password" filter.err &&
  grep -q "^nbdkit: \([^ :]*: \)\?error: hint: a backing file's own password is given with qcow2-backing-password=" \
    filter.err || fail "filter: $(cat filter.err)"
# An unencrypted overlay over an encrypted backing file: only the
# backing file has a password.
qemu-img create -q -f qcow2 -b top.qcow2 -F qcow2 plain.qcow2
nbdkit -U - qcow2 plain.qcow2 backing-password=pw-top \
  backing-password=pw-mid backing-password=pw-base \
  --run 'nbdcopy "$uri" plain.raw' || fail "a plain overlay over the chain"
qemu-img convert "${chain_objs[@]}" --image-opts "$chain_opts" -O raw chain.raw
cmp chain.raw plain.raw || fail "a plain overlay over the chain reads other data"
# A password where no layer is encrypted: refused, naming the key
# given, the image untouched (the admin believes the disk encrypted);
# one password over a clear overlay of an encrypted chain opens the
# chain, and is served.
qemu-img create -q -f qcow2 clear.qcow2 1M
sum=$(md5sum < clear.qcow2)
expect_refused "clear.qcow2 is not encrypted, nor is any backing file, but password= was given" \
  qcow2 clear.qcow2 password=pw-top
grep -q "hint: without password= it is served as it is" "$tmp/refused.err" ||
  fail "a password for a clear image: no remedy"
expect_refused "clear.qcow2 is not encrypted, nor is any backing file, but backing-password= was given" \
  qcow2 clear.qcow2 backing-password=pw-top
nbdkit -U - --filter=qcow2 file clear.qcow2 qcow2-password=pw-top \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> filter.err &&
  fail "the filter served a clear image with qcow2-password="
grep -q "clear.qcow2 is not encrypted, nor is any backing file, but qcow2-password= was given" \
  filter.err || fail "filter: $(cat filter.err)"
[ "$(md5sum < clear.qcow2)" = "$sum" ] || fail "a refused password changed the image"
qemu-img create -q -f qcow2 -b s-top.qcow2 -F qcow2 s-plain.qcow2
nbdkit -U - qcow2 s-plain.qcow2 password=shared --run 'nbdinfo --size "$uri"' \
  > /dev/null || fail "one password for a clear overlay of an encrypted chain"
echo "secret files, passwords per layer, passphrase=: OK"
