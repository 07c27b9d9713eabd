#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# flush-coalesce under 8 connections that each loop over writes, zeroes
# or trims and a flush (coalesce-clients.py), over a plugin whose flush
# takes 0.1 s as a disk's may (the eval plugin over a file): every
# client flush is covered by a plugin flush (coalesce-check.py, as in
# test-coalesce-concurrent.sh), and the eight clients share most plugin
# flushes: the plugin sees fewer than half the flushes the clients sent.
source "${srcdir:-.}/functions.sh"
set -e
requires_python_nbd
requires_nbdkit_plugin eval
source "${srcdir:-.}/coalesce-functions.sh"

export disk=$tmp/eval.img
truncate -s 16M "$disk"
# The sanitizer runtime that ./nbdkit may preload is for nbdkit, not
# for the commands of the scripts (dd aborts under it).
clean='unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; '
run slow 8 10 "" --filter=flush-coalesce --filter=log \
  eval thread_model='echo parallel' can_multi_conn='exit 0' \
  get_size='echo 16M' trim='true' flush="$clean"'sleep 0.1' \
  pread="$clean"'dd if="$disk" skip=$4 count=$3 iflag=count_bytes,skip_bytes status=none' \
  pwrite="$clean"'dd of="$disk" seek=$4 conv=notrunc oflag=seek_bytes status=none'
check_counts slow
received=$(summary slow flushes) issued=$(summary slow plugin_flushes)
[ $((issued * 2)) -lt "$received" ] ||
  fail "slow flush: $issued plugin flushes for $received client flushes"
