#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Images for the benchmark harness (bench/run.sh).  Each is
# made with QEMU's tools, so that every server reads the same layout and
# none of them benefits from having written it.
#
#   mkimage.sh full SIZE QCOW2 RAW
#       Every cluster written (preallocation=full: zeros really written),
#       64 KiB clusters, and a raw file written the same way.
#   mkimage.sh mapped CLUSTER VSIZE QCOW2 RAW
#       Every cluster allocated in the L2 tables (preallocation=metadata)
#       over a sparse file, and a sparse raw file: a large disk whose
#       mapping is complete, for the L2 cache, without writing VSIZE.
#   mkimage.sh scattered CLUSTER VSIZE N QCOW2 RAW
#       N clusters written at random places over VSIZE, in random order;
#       RAW is the same disk, sparse.
#   mkimage.sh layout ORDER SIZE QCOW2
#       SIZE written in 64 KiB clusters, one write per cluster, in ORDER:
#       sequential, reverse, random, or partly-random (the 16 clusters of
#       each MiB shuffled, the MiBs in order).  QEMU allocates host
#       clusters in the order of the writes, so guest-sequential reads of
#       the last three map to scattered host runs.
#   mkimage.sh empty CLUSTER SIZE QCOW2 [LAZY]
#       An empty image (LAZY: lazy_refcounts=on).
#   mkimage.sh overlay BACKING QCOW2
#       An empty overlay over a qcow2 BACKING.
#
# Random orders come from a fixed seed, so images are reproducible.

set -euo pipefail

die () { echo "mkimage.sh: $*" >&2; exit 1; }

# qemu-io commands from stdin, with the page cache (as fast as it goes).
qio () { qemu-io -t writeback -f qcow2 "$1" >/dev/null; }

# Print the numbers 0..n-1 in ORDER, with a fixed seed.
order ()
{
  local what=$1 n=$2
  awk -v what="$what" -v n="$n" 'BEGIN {
    srand (6);
    for (i = 0; i < n; i++) a[i] = what == "reverse" ? n - 1 - i : i;
    if (what == "random")
      for (i = n - 1; i > 0; i--) {
        j = int (rand () * (i + 1)); t = a[i]; a[i] = a[j]; a[j] = t;
      }
    else if (what == "partly-random")
      for (g = 0; g < n; g += 16)
        for (i = (g + 16 < n ? g + 16 : n) - 1; i > g; i--) {
          j = g + int (rand () * (i - g + 1)); t = a[i]; a[i] = a[j]; a[j] = t;
        }
    else if (what != "sequential" && what != "reverse")
      exit 1;
    for (i = 0; i < n; i++) print a[i];
  }' || die "unknown order $what"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  full)
    [ $# -eq 3 ] || die "usage: full SIZE QCOW2 RAW"
    qemu-img create -q -f qcow2 -o preallocation=full "$2" "$1"
    qemu-img create -q -f raw -o preallocation=full "$3" "$1"
    ;;
  mapped)
    [ $# -eq 4 ] || die "usage: mapped CLUSTER VSIZE QCOW2 RAW"
    qemu-img create -q -f qcow2 -o cluster_size="$1",preallocation=metadata \
             "$3" "$2"
    rm -f "$4"
    truncate -s "$2" "$4"
    ;;
  scattered)
    [ $# -eq 5 ] || die "usage: scattered CLUSTER VSIZE N QCOW2 RAW"
    cs=$(numfmt --from=iec "$1")
    vs=$(numfmt --from=iec "$2")
    qemu-img create -q -f qcow2 -o cluster_size="$cs" "$4" "$vs"
    # N distinct clusters out of VSIZE/CLUSTER, in random order.
    awk -v n="$3" -v slots=$((vs / cs)) -v cs="$cs" 'BEGIN {
      srand (7);
      while (k < n) {
        c = int (rand () * slots);
        if (!(c in seen)) {
          seen[c] = 1; k++;
          printf "write -P %d %.0f %d\n", k % 255 + 1, c * cs, cs;
        }
      }
    }' | qio "$4"
    rm -f "$5"
    qemu-img convert -O raw -S 64k "$4" "$5"
    ;;
  layout)
    [ $# -eq 3 ] || die "usage: layout ORDER SIZE QCOW2"
    n=$(( $(numfmt --from=iec "$2") / 65536 ))
    qemu-img create -q -f qcow2 -o cluster_size=64k "$3" "$2"
    order "$1" "$n" | awk '{ printf "write -P %d %.0f 65536\n", $1 % 255 + 1, $1 * 65536 }' |
      qio "$3"
    ;;
  empty)
    [ $# -eq 3 ] || [ $# -eq 4 ] || die "usage: empty CLUSTER SIZE QCOW2 [LAZY]"
    rm -f "$3"
    qemu-img create -q -f qcow2 \
             -o cluster_size="$1",lazy_refcounts="${4:-off}" "$3" "$2"
    ;;
  overlay)
    [ $# -eq 2 ] || die "usage: overlay BACKING QCOW2"
    rm -f "$2"
    qemu-img create -q -f qcow2 -b "$1" -F qcow2 "$2"
    ;;
  *)
    die "usage: mkimage.sh full|mapped|scattered|layout|empty|overlay ..."
    ;;
esac
