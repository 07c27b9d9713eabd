#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The admin's policy for images from someone else, in the plugin and
# the filter: backing-protocols= (what a backing name may reach),
# backing-root= (local backing and data files under a folder, symbolic
# links followed), backing-insecure=false (a name turning off TLS
# certificate or ssh host key checks), backing-tls-psk-file= and
# backing-tls-certificates= (the admin's credentials for nbds://).
# Each refusal is one clear message, and a hint naming the value that
# allows it; what is allowed still reads the base's bytes (QEMU's
# reading of the same chain is the reference).  Protocols are named
# without case, in the key and in names (URL schemes).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh openssl
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/overlay-functions.sh"      # expect_unserved

# hinted REMEDY: the refusal just seen is followed by this hint.
hinted ()
{
  grep -A1 'refused' "$tmp/refused.err" | grep -qxF "nbdkit: error: hint: $1" ||
    fail "no hint \"$1\" after the refusal: $(cat "$tmp/refused.err")"
}

mkdir -p "$tmp/root/sub" "$tmp/outside"
base=$tmp/root/sub/base.raw
qemu-img create -q -f raw "$base" 1M
QIO_FMT=raw qio "$base" 'write -P 0x33 0 64k'
cp "$base" "$tmp/outside/base.raw"
nbd_server raw -r file "$base"
sock=$tmp/raw.sock

# reads_base IMG ARGS...: the plugin serving IMG with ARGS reads the
# base's first 64k.
reads_base ()
{
  local img="$1"; shift
  timeout 60 nbdkit -U - qcow2 "$img" "$@" \
    --run 'nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\\x33\" * 65536"' ||
    fail "$img $*: not served, or other bytes"
}

# overlay NAME BACKING: $tmp/root/NAME.qcow2 over BACKING (raw).
overlay ()
{
  qemu-img create -q -f qcow2 -u -b "$2" -F raw "$tmp/root/$1.qcow2" 1M
}

# backing-protocols=
overlay local "$base"
overlay nbd "nbd+unix:///?socket=$sock"
overlay json 'json:{"driver":"raw","file":{"driver":"file","filename":"'"$base"'"}}'
reads_base "$tmp/root/local.qcow2" backing-protocols=file
reads_base "$tmp/root/nbd.qcow2" backing-protocols=http,nbd
reads_base "$tmp/root/local.qcow2" backing-protocols=FILE,Nbd
for img in local json; do
  expect_refused "cannot open backing file \".*\": a local file, protocol file is refused by backing-protocols=nbd,https" \
    qcow2 "$tmp/root/$img.qcow2" backing-protocols=nbd,https
  hinted "backing-protocols=nbd,https,file allows it"
  expect_unserved "a local file, protocol file is refused by backing-protocols=nbd" \
    --filter=qcow2 file "$tmp/root/$img.qcow2" backing-protocols=nbd
done
expect_refused "cannot open backing file \"nbd\\+unix:.*\": protocol nbd is refused by backing-protocols=file" \
  qcow2 "$tmp/root/nbd.qcow2" backing-protocols=file
expect_refused "protocol nbd is refused by backing-protocols=\$" \
  qcow2 "$tmp/root/nbd.qcow2" backing-protocols=
hinted "backing-protocols=nbd allows it"
# The filter's backing= (the admin's own name) too.
expect_unserved "protocol nbd is refused by backing-protocols=file" \
  --filter=qcow2 file "$tmp/root/local.qcow2" \
  backing="nbd+unix:///?socket=$sock" backing-protocols=file
for url in https://127.0.0.1:1/x SSH://127.0.0.1:1/x Nbds://127.0.0.1:1/; do
  overlay web "$url"
  proto=$(echo "${url%%:*}" | tr A-Z a-z)
  expect_refused "protocol $proto is refused by backing-protocols=file,nbd" \
    qcow2 "$tmp/root/web.qcow2" backing-protocols=file,nbd
  hinted "backing-protocols=file,nbd,$proto allows it"
done
expect_refused 'backing-protocols: "ftp" is not a protocol here' \
  qcow2 "$tmp/root/local.qcow2" backing-protocols=file,ftp

# backing-root=: under it (a relative name, a symbolic link inside)
# served; outside (an absolute name, "..", a link out) refused.
ln -s sub/base.raw "$tmp/root/in-link.raw"
ln -s ../outside/base.raw "$tmp/root/out-link.raw"
overlay rel sub/base.raw
overlay inlink in-link.raw
overlay abs-out "$tmp/outside/base.raw"
overlay dotdot ../outside/base.raw
overlay outlink out-link.raw
for img in local rel inlink; do
  reads_base "$tmp/root/$img.qcow2" backing-root="$tmp/root"
done
reads_base "$tmp/root/outlink.qcow2" backing-root=/
for img in abs-out dotdot outlink; do
  expect_refused "cannot open backing file \".*\": it is $tmp/outside/base.raw, not under backing-root=$tmp/root: refused" \
    qcow2 "$tmp/root/$img.qcow2" backing-root="$tmp/root"
  hinted "backing-root=$tmp allows it"
  expect_unserved "it is $tmp/outside/base.raw, not under backing-root=$tmp/root: refused" \
    --filter=qcow2 file "$tmp/root/$img.qcow2" backing-root="$tmp/root"
done
# A folder whose name the outside's begins with is not the folder.
mkdir "$tmp/root2"
cp "$base" "$tmp/root2/base.raw"
overlay prefix "$tmp/root2/base.raw"
expect_refused "it is $tmp/root2/base.raw, not under backing-root=$tmp/root: refused" \
  qcow2 "$tmp/root/prefix.qcow2" backing-root="$tmp/root"
# An external data file is a local file named by the image too.
qemu-img create -q -f qcow2 -o data_file="$tmp/outside/data.raw" \
  "$tmp/root/data.qcow2" 1M
expect_refused "external data file .*it is $tmp/outside/data.raw, not under backing-root=$tmp/root: refused" \
  qcow2 "$tmp/root/data.qcow2" backing-root="$tmp/root"
expect_refused "backing-root: .*$tmp/none" \
  qcow2 "$tmp/root/local.qcow2" backing-root="$tmp/none"

# backing-insecure=false: the image's own "sslverify": false or
# host_key_check=no refused before any connection; allowed by default
# (test-remote-http.sh, test-remote-ssh.sh).
overlay noverify 'json:{"driver":"raw","file":{"driver":"https","url":"https://127.0.0.1:1/x","sslverify":false}}'
expect_refused "the name turns off the check of the server's certificate \\(\"sslverify\": false\\): refused with backing-insecure=false" \
  qcow2 "$tmp/root/noverify.qcow2" backing-insecure=false
hinted "backing-insecure=true allows it"
overlay nohostkey 'ssh://127.0.0.1:1/x?host_key_check=no'
expect_refused "the name turns off the ssh host key check \\(host_key_check=no\\): refused with backing-insecure=false" \
  qcow2 "$tmp/root/nohostkey.qcow2" backing-insecure=false
expect_unserved "turns off the ssh host key check" \
  --filter=qcow2 file "$tmp/root/nohostkey.qcow2" backing-insecure=false
reads_base "$tmp/root/nbd.qcow2" backing-insecure=false

# nbds://: the admin's pre-shared key, and X.509 credentials (a CA of
# our own; another CA is refused).
echo "alice:$(openssl rand -hex 32)" > "$tmp/keys.psk"
port=$(free_port)
nbd_server psk -r -p "$port" --tls=require --tls-psk="$tmp/keys.psk" \
  file "$base"
overlay psk "nbds://127.0.0.1:$port/"
expect_refused "cannot open backing file \"nbds://127.0.0.1:$port/\": .*" \
  qcow2 "$tmp/root/psk.qcow2"
reads_base "$tmp/root/psk.qcow2" backing-tls-psk-file="$tmp/keys.psk" \
  backing-tls-username=alice
reads_base "$tmp/root/psk.qcow2" backing-tls-psk-file="$tmp/keys.psk" \
  backing-tls-username=alice backing-protocols=nbds

mkdir "$tmp/srv" "$tmp/cli" "$tmp/other"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$tmp/ca-key.pem" \
  -out "$tmp/srv/ca-cert.pem" -days 2 -subj /CN=test-ca 2>/dev/null
openssl req -x509 "${ec[@]}" -keyout "$tmp/other-key.pem" \
  -out "$tmp/other/ca-cert.pem" -days 2 -subj /CN=other-ca 2>/dev/null
openssl req "${ec[@]}" -keyout "$tmp/srv/server-key.pem" \
  -out "$tmp/server.csr" -subj /CN=127.0.0.1 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$tmp/ext"
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/srv/ca-cert.pem" \
  -CAkey "$tmp/ca-key.pem" -CAcreateserial -out "$tmp/srv/server-cert.pem" \
  -days 2 -extfile "$tmp/ext" 2>/dev/null
cp "$tmp/srv/ca-cert.pem" "$tmp/cli/"
port=$(free_port)
nbd_server x509 -r -p "$port" --tls=require --tls-certificates="$tmp/srv" \
  file "$base"
overlay x509 "nbds://127.0.0.1:$port/"
reads_base "$tmp/root/x509.qcow2" backing-tls-certificates="$tmp/cli"
expect_refused "cannot open backing file \"nbds://127.0.0.1:$port/\": .*certificate" \
  qcow2 "$tmp/root/x509.qcow2" backing-tls-certificates="$tmp/other"
