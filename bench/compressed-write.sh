#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Making a compressed image: nbdcopy --connections=4 into our plugin
# with create=true compress=TYPE, against qemu-img convert -c -o
# compression_type=TYPE, from the same raw file, in turn (rotated order
# each round).  The raw file (SIZE): half text-like data (compressible,
# about 4:1), a quarter random (stored plain by both), a quarter zeros,
# in 1 MiB pieces.  Prints the wall time of each (median), the image
# sizes, and checks each image (qemu-img compare with the raw file,
# qemu-img check).
#
# Usage: bench/compressed-write.sh [ROUNDS [SIZE [TYPES]]]
#        (default 3 1G "zstd zlib")
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
export PATH=/usr/bin:$PATH
rounds=${1:-3} size=${2:-1G} types=${3:-zstd zlib}
work=$(mktemp -d /var/tmp/compressed-write.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$work/src.raw

/usr/bin/python3 - "$src" "$(numfmt --from=iec "$size")" <<'EOF'
import os, random, sys
path, size = sys.argv[1], int(sys.argv[2])
r = random.Random(42)
words = [w.encode() for w in "the qcow2 cluster refcount table of a disk image "
         "is read and written by nbdkit and qemu alike with zstd or zlib "
         "compression 0123456789".split()]
text = b" ".join(r.choice(words) for _ in range(1 << 20))[:8 << 20]
M = 1 << 20
with open(path, "wb") as f:
    for i in range(size // M):
        kind = i % 4
        if kind in (0, 1):
            off = (i * 7919 * 4096) % (len(text) - M)
            f.write(text[off:off + M])
        elif kind == 2:
            f.write(os.urandom(M))
        else:
            f.seek(M, 1)
    f.truncate(size)
EOF

now () { date +%s.%N; }

# one SERVER TYPE OUT: make OUT; prints the seconds it took.
one ()
{
  local t0 t1
  rm -f "$3"
  sync
  t0=$(now)
  case $1 in
    ours)
      nbdkit -U - "$plugin" "file=$3" create=true "size=$size" "compress=$2" \
        --run "nbdcopy --connections=4 '$src' \"\$uri\"" ;;
    qemu-img)
      qemu-img convert -c -f raw -O qcow2 -o "compression_type=$2" "$src" "$3" ;;
  esac
  t1=$(now)
  echo "$t1 - $t0" | bc
}

echo "| type | ours s | qemu-img convert -c s | time ours/qemu-img | ours bytes | qemu-img bytes | size ours/qemu-img |"
echo "|---|---|---|---|---|---|---|"
for type in $types; do
  : > "$work/times"
  for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="ours qemu-img"; else order="qemu-img ours"; fi
    for s in $order; do
      echo "$s $(one "$s" "$type" "$work/$s.qcow2")" >> "$work/times"
    done
  done
  for s in ours qemu-img; do
    qemu-img compare -q -f raw -F qcow2 "$src" "$work/$s.qcow2" ||
      { echo "$s: the image differs from the raw file" >&2; exit 1; }
    qemu-img check -q "$work/$s.qcow2" ||
      { echo "$s: qemu-img check failed" >&2; exit 1; }
  done
  /usr/bin/python3 - "$work/times" "$type" "$(stat -c %s "$work/ours.qcow2")" \
    "$(stat -c %s "$work/qemu-img.qcow2")" "$work/ratios" <<'EOF'
import statistics, sys
t = {"ours": [], "qemu-img": []}
for line in open(sys.argv[1]):
    s, v = line.split()
    t[s].append(float(v))
o, q = statistics.median(t["ours"]), statistics.median(t["qemu-img"])
so, sq = int(sys.argv[3]), int(sys.argv[4])
print(f"| {sys.argv[2]} | {o:.2f} | {q:.2f} | {o / q:.2f} | {so} | {sq} | {so / sq:.3f} |")
with open(sys.argv[5], "a") as f:
    f.write(f"{sys.argv[2]}, time\tqemu-img convert -c\t{o / q:.3f}\tlower\n"
            f"{sys.argv[2]}, image size\tqemu-img convert -c\t{so / sq:.3f}\tlower\n")
print("rounds:", sorted(t["ours"]), sorted(t["qemu-img"]), file=sys.stderr)
EOF
done
echo "(medians of $rounds rounds; $size raw file; $(nproc) CPUs)"
# The ratios into bench/ratios.tsv and its chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "compressed writes (bench/compressed-write.sh)" < "$work/ratios"
