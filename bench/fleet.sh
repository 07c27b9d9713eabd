#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A fleet of VM disks: N qcow2 overlays over one 1 GiB golden qcow2
# base (random data), each opened by a client that does what a boot
# does to its disk, every client staying connected until the servers'
# memory is read.  Servers, in interleaved rounds on the same images
# (fresh copies of the overlays for each):
#   ours      one nbdkit, our plugin with dir= (clients name their
#             overlay), nbdkit's default threads
#   ours-t2   the same with nbdkit -t 2 (what nbdkit's threads per
#             connection cost: each keeps a buffer as large as the
#             largest request it served, and its stack)
#   ours-t1   the same with nbdkit -t 1 (each connection's requests
#             served by its own thread, one at a time)
#   qemu-nbd  one qemu-nbd per overlay (--cache=writeback), each on a
#             socket of its own
#   qsd       one qemu-storage-daemon: the base one read-only node that
#             the N overlay nodes share ("backing": the base's node
#             name), N NBD exports on one socket, all added over QMP
#             by this script
#   file      nbdkit's file plugin serving the base's raw data, every
#             disk the same export, nbdkit's default threads: no image
#             to open, no qcow2, the least an nbdkit server does for a
#             client (what the first byte and memory cost on this
#             machine before any server's own work); local base only.
#             The disks share one file: their writes go to a copy of
#             it, and then the client checks no data
#   file-t1   the same with nbdkit -t 1 (the floor of ours-t1)
# Bases:
#   local     the base a file beside the overlays
#   nbd       the base served by nbdkit's file plugin on a Unix socket
#             with 2 ms on every read (delay filter), the overlays'
#             backing file an nbd+unix:// URL; its reads are counted by
#             the log filter (a fresh base server for every run)
# The client (bench/fleetclient.c, built here: C and libnbd, as a VM's
# disk is QEMU's C client, one thread a disk, in one process; the
# disks in waves of FLEET_WAVE (default 40) started together, each
# wave once the one before has done its I/O, all staying connected;
# until 2026-11-28 it was Python's nbd module, whose threads take
# turns under one interpreter lock: the IOPS measured were the
# client's more than the servers'):
# connect, read 4 KiB at 0 (the boot sector: the first byte), then 63
# reads of 4 to 64 KiB at random places and 4 sequential runs of
# 8 x 64 KiB (2 MiB), the same places for every disk (one golden image,
# one boot; seed 1), each checked against the base's data; then 16
# (FLEET_WRITES) writes at random places of its own, each 4 KiB times
# a power of two up to FLEET_WRITE_MAX (default 4K; each power as
# likely), cut at the server's advertised maximum request as QEMU's
# client does, a flush, and the writes read back and checked.  Then
# FLEET_LATE (default 8) late disks, more overlays of the same base, do
# the same one at a time, each once the one before is done, all the
# others still connected: a VM started on a server running the fleet
# (qsd gets each one's node and export over QMP just before its client
# connects, qemu-nbd a server for it).
# Measured, per run, once every client of the waves has done its I/O
# (before the late disks):
#   PSS, RSS  the sum over the server's processes (and their children;
#             the base's own server not counted), from
#             /proc/PID/smaps_rollup and /proc/PID/status; MiB
#   threads   the server processes' threads, all told
#   first byte  time from the start of the connection to the first
#             read's data, per disk: median and 90th percentile (ms).
#             Ours opens an overlay when its first client connects, so
#             that is in ours; qemu-nbd and qsd opened theirs before.
#             In a wave every client connects at once: on 2 cores that
#             is mostly each handshake's wait for a core among the
#             other clients' I/O (qsd's too)
#   first byte, late  the same, median of the late disks: what opening
#             a disk costs a VM started while the others run
#   IOPS      the waves' reads (96 a disk) over the time spent
#             reading: each wave's, from its start to its last read,
#             summed (not the writes and flush that the next wave
#             waits for, which are no reads)
#   CPU s     user and system time of the server's processes, from
#             their start to then (their setup included): on cores
#             shared with other work, what IOPS is bought with
#   base MiB  bytes the base's server served (nbd base); the local
#             base: n/a (the page cache serves a local file's reads,
#             so no count at the file means what one at a server does)
#   base metadata KiB  of them, those outside the base's data clusters
#             (qemu-img map): its header, tables and L2 tables, read
#             once by a server that opens the base once
#   base conns  connections the base's server saw (nbd base), or the
#             descriptors of the base file open in the servers (local):
#             how many times the base is opened
# Usage: bench/fleet.sh [--quick] [ROUNDS [N...]]   (default 1 round
# of N = 40 and 200, about 5 minutes on 2 loaded cores; 3 rounds of 40,
# 3; --quick: 1 round of N = 10).  FLEET_SERVERS and FLEET_BASES pick
# servers (or builds of other trees as ours: BENCH_TREES, bench/lib.sh;
# every other round in reverse order) and bases; FLEET_WAVE the wave size; FLEET_OURS_ARGS more
# nbdkit options and plugin keys for ours (nbdkit's options first, the
# keys after "--": "-t 1 -- l2-slice-size=4096") and FLEET_OURS_ENV
# its environment's more variables ("MALLOC_ARENA_MAX=2"), to measure
# the knobs the man page's FLEET section gives; FLEET_LATE the late
# disks (0: none); FLEET_WRITES the writes a disk makes (default 16;
# 0: it only reads, and flushes), FLEET_WRITE_MAX their largest size
# (4K to 32M, a power of two); FLEET_FILE_MAX the longest request the
# file servers' clients send, as if they advertised it (nbdkit's file
# plugin advertises none: 32M, as ours; set it to ours' max-request=
# to keep them its floor).
# The ratios (memory and first byte: peer/ours; IOPS: ours/peer; above
# 1 is ours better) go into bench/ratios.tsv unless BENCH_UPDATE=0 (set
# it for a partial run: the bench's rows are replaced as a whole).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=$top:/usr/bin:$PATH
if [ "${1:-}" = --quick ]; then
  shift; rounds=1 sizes=10
else
  rounds=${1:-1}; shift || true
  sizes=${*:-40 200}
fi
servers=${FLEET_SERVERS:-ours ours-t2 ours-t1 qemu-nbd qsd}
bases=${FLEET_BASES:-local nbd}
wave=${FLEET_WAVE:-40}
late=${FLEET_LATE:-8}
writes=${FLEET_WRITES:-16}
write_max=$(numfmt --from=iec "${FLEET_WRITE_MAX:-4K}")
(( write_max >= 4096 && write_max <= 32 << 20 &&
   (write_max & (write_max - 1)) == 0 )) || {
  echo "fleet.sh: FLEET_WRITE_MAX=$FLEET_WRITE_MAX: a power of two," \
    "4K to 32M" >&2
  exit 1
}
file_max=$(numfmt --from=iec "${FLEET_FILE_MAX:-0}")
# BENCH_TSV's cases name a largest write other than 4K: 40-local-w4M-pss.
wtag=
if ((write_max >= 1 << 20)); then wtag=-w$((write_max >> 20))M
elif ((write_max > 4096)); then wtag=-w$((write_max >> 10))K
fi
case " $servers " in
  *" file "* | *" file-t"*)
    [ "$(echo $bases)" = local ] || {
      echo "fleet.sh: the file server needs FLEET_BASES=local" >&2
      exit 1
    } ;;
esac
ours_args=${FLEET_OURS_ARGS:-}
read -r -a ours_opts <<< "${ours_args%%--*}"
ours_keys=()
[[ $ours_args != *--* ]] || read -r -a ours_keys <<< "${ours_args#*--}"
work=$(mktemp -d /var/tmp/fleet-bench.XXXXXX)
pids=()
stop_all ()
{
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do sleep 0.05; done
  done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
echo "bench/fleet.sh: $rounds round(s), N = $sizes, waves of $wave," \
  "$late late disks;" \
  "$(nproc) cores, load average $(bench_load) at start" \
  "${FLEET_OURS_ARGS:+; ours with $FLEET_OURS_ARGS}" \
  "${FLEET_OURS_ENV:+; ours run with $FLEET_OURS_ENV}"

# The client (bench/fleetclient.c); the plan of its I/O, the
# measurement of the servers and the QMP client that sets up
# qemu-storage-daemon.
cc -O2 -o "$work/fleetclient" "$top/bench/fleetclient.c" \
  $(pkg-config --cflags --libs libnbd) -pthread
cat > "$work/fleet.py" <<'EOF'
import json, os, random, socket, sys, time

K = 1024


def plan(n, raw, out, writes, write_max):
    """Writes the I/O of n disks for bench/fleetclient.c: the reads
    every disk does, then each disk's writes."""
    size = os.path.getsize(raw)
    rnd = random.Random(1)
    scattered = [(0, 4 * K)] + [
        (rnd.randrange(size // (4 * K) - 16) * 4 * K, rnd.randrange(1, 17) * 4 * K)
        for _ in range(63)]
    with open(out, "w") as f:
        for i, r in enumerate(scattered):
            f.write("R %d %d\n" % r)
            if i % 16 == 15:
                start = rnd.randrange(size // (64 * K) - 8) * 64 * K
                for j in range(8):
                    f.write("R %d %d\n" % (start + j * 64 * K, 64 * K))
        # A write's length 4 KiB times a power of two up to write_max,
        # each as likely (a guest's writes: many small, a few large).
        sizes = [4 * K << k for k in range(write_max.bit_length() - 12)]
        for i in range(n):
            w = random.Random(1000 + i)
            lens = random.Random(2000 + i)
            places = []
            for _ in range(writes):
                length = lens.choice(sizes)
                places.append("%d:%d" % (
                    w.randrange((size - length) // (4 * K) + 1) * 4 * K,
                    length))
            f.write("W %s\n" % " ".join(places))


def measure(pids_file, base):
    """Prints the memory, threads, descriptors of base and CPU time of
    the processes of pids_file and their children, one line."""
    roots = [int(p) for p in open(pids_file).read().split()]
    procs = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open("/proc/%s/stat" % p).read()
                procs[int(p)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    ours = set(roots)
    grew = True
    while grew:
        kids = {p for p, pp in procs.items() if pp in ours} - ours
        grew = bool(kids)
        ours |= kids
    rss = pss = nthreads = fds = ticks = 0
    base = os.path.realpath(base)
    for p in ours:
        try:
            stat = open("/proc/%d/stat" % p).read()
            ticks += sum(int(x) for x in stat[stat.rindex(")") + 2:].split()[11:13])
            for l in open("/proc/%d/status" % p):
                if l.startswith("VmRSS:"):
                    rss += int(l.split()[1])
                elif l.startswith("Threads:"):
                    nthreads += int(l.split()[1])
            for l in open("/proc/%d/smaps_rollup" % p):
                if l.startswith("Pss:"):
                    pss += int(l.split()[1])
            for fd in os.listdir("/proc/%d/fd" % p):
                try:
                    if os.readlink("/proc/%d/fd/%s" % (p, fd)) == base:
                        fds += 1
                except OSError:
                    pass
        except OSError:
            pass
    print("%.1f %.1f %d %d %.2f" % (pss / 1024, rss / 1024, nthreads, fds,
                                    ticks / os.sysconf("SC_CLK_TCK")))


def qmp_connect(sock):
    """Returns a function running a QMP command of qemu-storage-daemon
    (at its QMP socket) and returning its answer."""
    s = socket.socket(socket.AF_UNIX)
    for _ in range(600):
        try:
            s.connect(sock)
            break
        except OSError:
            time.sleep(0.05)
    f = s.makefile("rw")
    json.loads(f.readline())

    def cmd(execute, **args):
        f.write(json.dumps({"execute": execute, "arguments": args}) + "\n")
        f.flush()
        while True:
            r = json.loads(f.readline())
            if "error" in r:
                sys.exit("QMP %s: %s" % (execute, r["error"]["desc"]))
            if "return" in r:
                return r["return"]

    cmd("qmp_capabilities")
    return cmd


def qmp_overlay(cmd, i, path):
    cmd("blockdev-add", driver="qcow2", **{"node-name": "o%d" % i},
        file={"driver": "file", "filename": path}, backing="base")


def qmp_export(cmd, i, name):
    cmd("block-export-add", type="nbd", id="e%d" % i,
        **{"node-name": "o%d" % i}, name=name, writable=True)


def qmp(sock, base, base_sock, nbd_sock, pairs_file):
    """Sets up qemu-storage-daemon over its QMP socket: the base node,
    an overlay node over it for each image of pairs_file, the NBD
    server and an export for each."""
    cmd = qmp_connect(sock)
    if base_sock:
        proto = {"driver": "nbd", "server": {"type": "unix", "path": base_sock}}
    else:
        proto = {"driver": "file", "filename": base}
    cmd("blockdev-add", driver="qcow2", **{"node-name": "base"},
        **{"read-only": True}, file=proto)
    images = [l.rstrip("\n").split("\t") for l in open(pairs_file)]
    for i, (path, name) in enumerate(images):
        qmp_overlay(cmd, i, path)
    # Debian's QEMU 7.2 allows 100 connections unless told (the fix of
    # CVE-2024-7409): 0 is no bound, as qemu-nbd's -e 0 and ours.
    cmd("nbd-server-start", addr={"type": "unix", "data": {"path": nbd_sock}},
        **{"max-connections": 0})
    for i, (path, name) in enumerate(images):
        qmp_export(cmd, i, name)


def qmp_add(sock, pairs_file, i):
    """A late disk: the overlay node and export of image i of
    pairs_file added to qemu-storage-daemon set up by qmp, as a new VM
    needs."""
    path, name = open(pairs_file).read().splitlines()[i].split("\t")
    cmd = qmp_connect(sock)
    qmp_overlay(cmd, i, path)
    qmp_export(cmd, i, name)


if sys.argv[1] == "plan":
    plan(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]),
         int(sys.argv[6]))
elif sys.argv[1] == "measure":
    measure(sys.argv[2], sys.argv[3])
elif sys.argv[1] == "qmp-add":
    qmp_add(sys.argv[2], sys.argv[3], int(sys.argv[4]))
else:
    qmp(*sys.argv[2:6], sys.argv[6])
EOF

# What the client runs once the waves' I/O is done: the servers
# measured, and the base's server's log kept as it is then (the late
# disks' reads not counted); and what it runs before a late disk's
# client connects (its index among the images the argument), to
# qemu-storage-daemon or to its own qemu-nbd.
cat > "$work/measure" <<EOF
#!/bin/sh
/usr/bin/python3 "$work/fleet.py" measure "$work/spids" "$work/base.qcow2" &&
  { [ ! -f "$work/base.log" ] || cp "$work/base.log" "$work/base.log.measured"; }
EOF
cat > "$work/prepare-qsd" <<EOF
#!/bin/sh
exec /usr/bin/python3 "$work/fleet.py" qmp-add "$work/qmp.sock" "$work/images" "\$1"
EOF
cat > "$work/prepare-qemu-nbd" <<EOF
#!/bin/sh
i=\$((\$1 + 1))
name=\$(sed -n "\${i}p" "$work/images" | cut -f2)
qemu-nbd -k "$work/q\$i.sock" -f qcow2 --cache=writeback \\
  "$work/ovl/\$name" >/dev/null 2>&1 &
echo \$! >> "$work/late.pids"
for t in \$(seq 3000); do [ -S "$work/q\$i.sock" ] && exit; sleep 0.01; done
echo "fleet.sh: $work/q\$i.sock not there after 30 s" >&2
exit 1
EOF
chmod +x "$work/measure" "$work/prepare-qsd" "$work/prepare-qemu-nbd"

# The base: 1 GiB of random data, as qcow2; the raw data kept for the
# client's checks.
head -c 1G /dev/urandom > "$work/base.raw"
qemu-img convert -f raw -O qcow2 "$work/base.raw" "$work/base.qcow2"
qemu-img map -f qcow2 --output=json "$work/base.qcow2" > "$work/base.map"
qemu-img create -q -u -f qcow2 -F qcow2 -b "$work/base.qcow2" \
  "$work/tmpl-local.qcow2" 1G
qemu-img create -q -u -f qcow2 -F qcow2 \
  -b "nbd+unix:///?socket=$work/base.sock" "$work/tmpl-nbd.qcow2" 1G

# one N BASE SERVER: a run; prints the client's line, then the base's
# bytes served and connections ("- -" for the local base).
one ()
{
  local n=$1 base=$2 server=$3 i name threads=() basefile prepare=true kind
  local check=1 cut=0
  rm -rf "$work/ovl" "$work"/*.sock "$work"/*.pid "$work"/base.log* \
    "$work/late.pids" "$work/shared.raw"
  mkdir "$work/ovl"
  : > "$work/pairs"
  : > "$work/images"
  for i in $(seq -f %03g $((n + late))); do
    name=vm$i.qcow2
    cp "$work/tmpl-$base.qcow2" "$work/ovl/$name"
    printf '%s\t%s\n' "$work/ovl/$name" "$name" >> "$work/images"
  done
  if [ "$base" = nbd ]; then
    nbdkit -r -U "$work/base.sock" -P "$work/base.pid" \
      --filter=delay --filter=log file "$work/base.qcow2" rdelay=2ms \
      logfile="$work/base.log"
    bench_wait_sock "$work/base.sock" "$work/base.pid"
    pids+=("$(cat "$work/base.pid")")
  fi
  kind=$(bench_kind "$server")
  case $kind in ours-t* | file-t*) threads=(-t "${kind##*-t}") ;; esac
  case $kind in
    ours*)
      env ${FLEET_OURS_ENV:-} \
        "$(bench_nbdkit "$server")" "${threads[@]}" "${ours_opts[@]}" \
        -U "$work/s.sock" \
        -P "$work/s.pid" qcow2 dir="$work/ovl" "${ours_keys[@]}"
      bench_wait_sock "$work/s.sock" "$work/s.pid"
      cat "$work/s.pid" > "$work/spids"
      while IFS=$'\t' read -r _ name; do
        printf '%s\t%s\n' "$work/s.sock" "$name" >> "$work/pairs"
      done < "$work/images" ;;
    file*)
      basefile=$work/base.raw
      # Its disks share one file: the writes go to a copy, and the
      # client checks no data (one disk's writes are another's reads).
      if [ "$writes" != 0 ]; then
        cp "$work/base.raw" "$work/shared.raw"
        basefile=$work/shared.raw check=0
      fi
      cut=$file_max
      nbdkit "${threads[@]}" -U "$work/s.sock" -P "$work/s.pid" \
        file "$basefile"
      bench_wait_sock "$work/s.sock" "$work/s.pid"
      cat "$work/s.pid" > "$work/spids"
      while read -r _; do
        printf '%s\t\n' "$work/s.sock" >> "$work/pairs"
      done < "$work/images" ;;
    qemu-nbd)
      : > "$work/spids"
      i=0
      while IFS=$'\t' read -r _ name; do
        i=$((i + 1))
        printf '%s\t\n' "$work/q$i.sock" >> "$work/pairs"
        # The late disks' servers start just before their clients.
        [ "$i" -le "$n" ] || continue
        qemu-nbd -k "$work/q$i.sock" -f qcow2 --cache=writeback \
          "$work/ovl/$name" >/dev/null 2>&1 &
        pids+=("$!")
        echo "$!" >> "$work/spids"
      done < "$work/images"
      for i in $(seq "$n"); do bench_wait_sock "$work/q$i.sock"; done
      prepare=$work/prepare-qemu-nbd ;;
    qsd)
      qemu-storage-daemon \
        --chardev socket,path="$work/qmp.sock",server=on,wait=off,id=qmp \
        --monitor chardev=qmp >/dev/null 2>&1 &
      pids+=("$!")
      echo "$!" > "$work/spids"
      if [ "$base" = nbd ]; then basefile=$work/base.sock; else basefile=; fi
      head -n "$n" "$work/images" > "$work/images.waves"
      /usr/bin/python3 "$work/fleet.py" qmp "$work/qmp.sock" \
        "$work/base.qcow2" "$basefile" "$work/s.sock" "$work/images.waves"
      bench_wait_sock "$work/s.sock"
      # A late disk's node and export are added (over QMP) just before
      # its client connects, as for a new VM.
      prepare=$work/prepare-qsd
      while IFS=$'\t' read -r _ name; do
        printf '%s\t%s\n' "$work/s.sock" "$name" >> "$work/pairs"
      done < "$work/images" ;;
  esac
  [[ $kind != ours* && $kind != file* ]] || pids+=("$(cat "$work/s.pid")")
  /usr/bin/python3 "$work/fleet.py" plan $((n + late)) "$work/base.raw" \
    "$work/plan" "$writes" "$write_max"
  FLEETCLIENT_CHECK=$check FLEETCLIENT_CUT=$cut "$work/fleetclient" \
    "$work/plan" "$work/pairs" "$work/base.raw" "$wave" "$late" "$prepare" \
    "$work/measure"
  [ ! -f "$work/late.pids" ] || pids+=($(cat "$work/late.pids"))
  stop_all
  if [ "$base" = nbd ]; then
    /usr/bin/python3 -c '
import json, re, sys
# The data clusters of the base: whatever else is read is metadata.
data = [(e["offset"], e["offset"] + e["length"])
        for e in json.load(open(sys.argv[2])) if e.get("offset") is not None]
got = meta = conns = 0
for line in open(sys.argv[1]):
    if " Read id=" in line:
        off = int(re.search(r" offset=(0x[0-9a-f]+|[0-9]+)", line).group(1), 0)
        n = int(re.search(r" count=(0x[0-9a-f]+|[0-9]+)", line).group(1), 0)
        got += n
        meta += n - sum(max(0, min(off + n, e) - max(off, s)) for s, e in data)
    elif " Connect " in line:
        conns += 1
print("%.1f %.0f" % (got / 1048576, meta / 1024), conns)' \
      "$work/base.log.measured" "$work/base.map"
  else
    echo "- - -"
  fi
}

declare -A res
add () { res[$1]+="$2 "; }
for r in $(seq "$rounds"); do
  for n in $sizes; do
    for b in $bases; do
      for s in $(bench_order "$r" $servers); do
        one "$n" "$b" "$s" > "$work/out"
        out=$(tr '\n' ' ' < "$work/out")
        read -r pss rss thr fds cpu ttfb p90 iops nreads rmib lfb bmib \
          bmeta bconns <<< "$out"
        [ "$b" = local ] && bconns=$fds
        # The file server opens no base image.
        [[ $s != file* ]] || bconns=-
        for k in pss rss ttfb p90 lfb iops thr cpu bmib bmeta bconns; do
          add "$n,$b,$s,$k" "${!k}"
          bench_record "$n-$b$wtag-$k" "$s" "$r" "${!k}"
        done
      done
    done
  done
done

m () { bench_median "${res[$1]}"; }
ratio () { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
echo "load average $(bench_load) at end;" \
  "$nreads reads a disk ($rmib MiB, and $writes writes of 4 KiB" \
  "${wtag:+to $(numfmt --to=iec "$write_max")}: copy on write reads" \
  "the rest of each one's clusters from the base);" \
  "medians of $rounds round(s)"
echo "| disks | base | server | PSS MiB | RSS MiB | threads | first byte ms, median | p90 | first byte ms, late disks' median | read IOPS | server CPU s | base MiB served | base metadata KiB served | base opened |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for n in $sizes; do
  for b in $bases; do
    for s in $servers; do
      k=$n,$b,$s
      bm=$(m "$k,bmib") bx=$(m "$k,bmeta")
      [ "$bm" = - ] && bm="n/a: local" bx="n/a: local"
      echo "| $n | $b | $s | $(m "$k,pss") | $(m "$k,rss") | $(m "$k,thr") |" \
        "$(m "$k,ttfb") | $(m "$k,p90") | $(m "$k,lfb") | $(m "$k,iops") |" \
        "$(m "$k,cpu") |" \
        "$bm | $bx |" \
        "$(m "$k,bconns") |"
    done
  done
done
: > "$work/ratios"
for n in $sizes; do
  for b in $bases; do
    for s in $servers; do
      case $(bench_kind "$s") in ours*) ;; *) continue ;; esac
      for p in $servers; do
        # The file server is a floor, not a peer.
        case $(bench_kind "$p") in ours*|file*) continue ;; esac
        k=$n,$b,$s q=$n,$b,$p
        printf '%s disks, %s base, %s: memory (PSS)\t%s\t%s\thigher\n' \
          "$n" "$b" "$s" "$p" "$(ratio "$(m "$q,pss")" "$(m "$k,pss")")"
        printf '%s disks, %s base, %s: first byte (median)\t%s\t%s\thigher\n' \
          "$n" "$b" "$s" "$p" "$(ratio "$(m "$q,ttfb")" "$(m "$k,ttfb")")"
        [ "$late" = 0 ] ||
          printf '%s disks, %s base, %s: first byte, late disks (median)\t%s\t%s\thigher\n' \
            "$n" "$b" "$s" "$p" "$(ratio "$(m "$q,lfb")" "$(m "$k,lfb")")"
        printf '%s disks, %s base, %s: read IOPS\t%s\t%s\thigher\n' \
          "$n" "$b" "$s" "$p" "$(ratio "$(m "$k,iops")" "$(m "$q,iops")")"
      done
    done
  done
done >> "$work/ratios"
echo "ratios (above 1: ours better; memory and first byte peer/ours, IOPS ours/peer):"
awk -F'\t' '{ printf "%s against %s: %s\n", $1, $2, $3 }' "$work/ratios"
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "a fleet of overlays (bench/fleet.sh)" < "$work/ratios"
echo "all rounds:"
for k in "${!res[@]}"; do echo "$k: ${res[$k]}"; done | sort
