#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files on an ssh server (an sshd of our own on the loopback
# address, the user's key in an ssh-agent of our own, as QEMU's ssh
# driver and nbdkit's ssh plugin both find it), read through nbdkit's
# ssh plugin, with QEMU's ssh driver as the oracle: an ssh:// URL, the
# json: form, and a qcow2 base on the server.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy ssh-keygen ssh-agent ssh-add /usr/sbin/sshd
requires_nbdkit_plugin ssh
requires_qemu_driver ssh
source "${srcdir:-.}/remote-functions.sh"
start_sshd
eval "$(ssh-agent -s -a "$tmp/agent.sock")" > /dev/null
servers+=("$SSH_AGENT_PID")
ssh-add -q "$tmp/user_key" 2>/dev/null

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 4M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 1M' 'write -P 0x12 3M 64k'
user=$(id -un)
# The host key is ours, and new: not checked (QEMU's host_key_check=no).
url="ssh://$user@127.0.0.1:$ssh_port$base?host_key_check=no"

qemu-img create -q -f qcow2 -b "$url" -F raw "$tmp/url.qcow2"
qio "$tmp/url.qcow2" 'write -P 0x21 1020k 8k'
check_image "$tmp/url.qcow2"

qemu-img create -q -f qcow2 -F raw -b 'json:{"driver":"raw","file":{"driver":"ssh","server":{"host":"127.0.0.1","port":"'"$ssh_port"'"},"path":"'"$base"'","user":"'"$user"'","host-key-check":{"mode":"none"}}}' \
  "$tmp/json.qcow2"
check_image "$tmp/json.qcow2"

# A qcow2 base on the server, over the raw base on the server.
qemu-img create -q -f qcow2 -b "$url" -F raw "$tmp/mid.qcow2"
qio "$tmp/mid.qcow2" 'write -P 0x31 2M 128k'
qemu-img create -q -f qcow2 -F qcow2 \
  -b "ssh://$user@127.0.0.1:$ssh_port$tmp/mid.qcow2?host_key_check=no" \
  "$tmp/top.qcow2"
check_image "$tmp/top.qcow2"
