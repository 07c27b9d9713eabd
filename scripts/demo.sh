#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job: build if needed, make a sample qcow2 image (with a
# backing file, zero and compressed clusters), serve it with the qcow2
# plugin and talk to it with nbdinfo and nbdsh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
export PATH="$PWD:/usr/bin:$PATH"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
qemu-img create -q -f qcow2 "$dir/base.qcow2" 64M
qemu-io -f qcow2 -c 'write -P 0x11 0 1M' "$dir/base.qcow2" >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$dir/sample.qcow2"
qemu-io -f qcow2 -c 'write -P 0x22 512k 64k' -c 'write -z 8M 1M' \
  -c 'write -c -P 0x33 16M 64k' "$dir/sample.qcow2" >/dev/null
echo "== qemu-img info"
qemu-img info "$dir/sample.qcow2" | sed -n '1,6p'
echo "== nbdkit qcow2 $dir/sample.qcow2"
nbdkit -U - qcow2 "$dir/sample.qcow2" --run '
  nbdinfo "$uri" | grep -E "export-size|is_read_only|can_multi_conn|block_size"
  echo "== nbdinfo --map"
  nbdinfo --map "$uri"
  echo "== nbdsh"
  nbdsh -u "$uri" -c "
print(\"byte at 0 (backing):     %#x\" % h.pread(1, 0)[0])
print(\"byte at 512k (overlay):  %#x\" % h.pread(1, 512*1024)[0])
print(\"byte at 16M (compressed): %#x\" % h.pread(1, 16*1024*1024)[0])
"'
