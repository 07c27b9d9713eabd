#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# External data files (data_file=, with and without data_file_raw=on),
# named relative to the image and found from another working directory
# (the plugin resolves the name against the image's folder, as it does
# for backing files; qemu 7.2 resolves it against its working directory,
# so qemu's reference names the data file explicitly there);
# the data-file= option overriding the recorded name (the data file
# moved away), with qemu's reference opened with data-file.filename=;
# data-file= on an image without a data file is refused; a missing data
# file is a clear error.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

mkdir -p "$tmp/img" "$tmp/moved" "$tmp/cwd"
for raw in off on; do
  img=$tmp/img/df-$raw.qcow2
  ( cd "$tmp/img" &&
    qemu-img create -q -f qcow2 \
      -o data_file=df-$raw.data,data_file_raw=$raw,cluster_size=4k "df-$raw.qcow2" 4M ) ||
    fail "creating $img"
  qemu-img info "$img" | grep -q "data file: df-$raw.data" ||
    fail "$img does not record its data file by a relative name"
  qemu-img info "$img" | grep -q "data file raw: $([ $raw = on ] && echo true || echo false)" ||
    fail "$img: data_file_raw is not $raw"
  ( cd "$tmp/img" && qio "$img" \
    'write -P 0x11 0 100k' \
    'write -P 0x12 1M 4097' \
    'write -z 2M 64k' \
    'write -P 0x13 3M 64k' \
    'discard 3M 8k' \
    'write -z -u 3200k 4k' \
    'write -P 0x14 4190208 4096' )
  ( cd "$tmp/img" && check_image "$img" )
  ( cd "$tmp/cwd" &&
    QEMU_IMG_SRC="driver=qcow2,file.filename=$img,data-file.driver=file,data-file.filename=$tmp/img/df-$raw.data" \
    check_image "$img" )

  # The data file moved: the image's recorded name no longer works; the
  # data-file= option (relative to nbdkit's working directory) does.
  mv "$tmp/img/df-$raw.data" "$tmp/moved/elsewhere-$raw.raw"
  expect_refused 'df-'$raw'\.data' qcow2 "file=$img"
  QEMU_IMG_SRC="driver=qcow2,file.filename=$img,data-file.driver=file,data-file.filename=$tmp/moved/elsewhere-$raw.raw" \
    check_image "$img" "data-file=$tmp/moved/elsewhere-$raw.raw"
  ( cd "$tmp/moved" &&
    QEMU_IMG_SRC="driver=qcow2,file.filename=$img,data-file.driver=file,data-file.filename=$tmp/moved/elsewhere-$raw.raw" \
    check_image "$img" "data-file=elsewhere-$raw.raw" )
  mv "$tmp/moved/elsewhere-$raw.raw" "$tmp/img/df-$raw.data"
done

# An external data file over a backing file: unallocated clusters show
# the backing file.
base=$tmp/base.qcow2
qemu-img create -q -f qcow2 "$base" 4M
qio "$base" 'write -P 0xbb 0 4M'
img=$tmp/img/dfb.qcow2
qemu-img create -q -f qcow2 -o data_file="$tmp/img/dfb.data" \
  -b "$base" -F qcow2 "$img"
qio "$img" 'write -P 0x21 64k 64k' 'write -z 1M 64k' 'write -P 0x22 2M 100'
check_image "$img"

# data-file= on an image without an external data file is refused.
expect_refused 'data.file' qcow2 "file=$base" "data-file=$tmp/img/dfb.data"
