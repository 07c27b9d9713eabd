# SPDX-License-Identifier: BSD-3-Clause
# The qemu-img convert matrix (fast zero), shared by
# tests/test-fastzero-convert.sh (which asserts every count) and
# bench/convert-matrix.sh (which times every case).  Source it after
# functions.sh, which provides $tmp and fail.
#
# One case copies a half-sparse source into an NBD export with
# qemu-img convert:
#
#   source     qcow2, 100 MiB: MiB 0, 2, 4, ... 98 written (bytes 1 to
#              50, never 0), MiB 1, 3, ... 99 never written.
#   target     nbdkit, from the client down to the plugin:
#     log         what the client sent and got back: above fastzero,
#                 so the fast zeroes that fastzero refuses show here
#     fastzero    the zeromode= and fastzeromode= of the case
#     blocksize   maxdata=256k: writes reach the plugin in 256 KiB
#                 pieces (zero requests are not split: maxlen is 4 GiB)
#     [latency]   the bench only: $CM_LATENCY, e.g. latency-write=2ms
#     iostats     what reached the plugin.  One iostats per nbdkit:
#                 its module is loaded once, so a second instance would
#                 share the first one's counters.
#     noextents   the target reports no holes, see below
#     plugin      memory 100M, or qcow2 over a fresh 100 MiB image
#   client     "convert": qemu-img convert -n -f qcow2 -O raw SRC URI
#              "prezero": first one fast zero of the whole export,
#              then the same convert, with --target-is-zero if the
#              fast zero succeeded (see below)
#
# What qemu-img 7.2 sends.  convert walks the source by block status,
# which alternates 1 MiB of data and 1 MiB unallocated, and a request
# never spans a change of status, so it sends one request per MiB:
#  - each data MiB: one write of 1 MiB (its buffer is 2 MiB, NBD's
#    limit 32 MiB).  No 4 KiB of it is zeroes, so -S 4k (the default)
#    turns none of it into a zero.
#  - each unallocated MiB, unless the target is known to be zero
#    (--target-is-zero): blk_co_pwrite_zeroes() with MAY_UNMAP.  If the
#    export offers zeroes that is one NBD zero request of 1 MiB, with
#    MAY_TRIM (trim=1 in the log); if not, qemu's block layer writes
#    1 MiB of zero bytes instead: one write of 1 MiB.
#  - no fast zero, ever.  qemu-img convert used to zero the whole target
#    first with fast zeroes (blk_make_zero() with BDRV_REQ_NO_FALLBACK)
#    and skip the holes if that worked; QEMU removed that pre-zeroing in
#    2020 (commit edafc70c0c, "qemu-img convert: Don't pre-zero
#    images").  So with qemu-img 7.2, fastzeromode changes what is
#    advertised and nothing that is sent.
# The "prezero" client does by hand what qemu-img used to do, to see
# the fast-zero modes at work: if the export advertises fast zeroes,
# one fast zero of all 100 MiB (with MAY_TRIM, as qemu-img did; it
# split it into 32 MiB requests, here it is one); on success
# convert --target-is-zero, which skips the unallocated MiBs; on
# ENOTSUP a plain convert.
#
# Why noextents: qemu-img 7.2 does not ask the target's block status
# (without noextents it sends no extents request either), but
# fastzeromode=probe does: without noextents, a fresh target reads as
# zeroes and probe would let the pre-zero succeed with nothing written,
# whatever the zeromode.  With noextents no range is known to read as
# zeroes, so probe passes fast zeroes to the plugin (notrim, plugin) or
# refuses them (emulate), as its manual says.  It also keeps the counts
# valid for a qemu-img that looks at the target before zeroing.
#
# The expected counts of each case follow from this and from
# nbdkit-fastzero-filter(1); see cm_expect.  Over a 100 MiB source:
#
#                           convert        prezero
#   zeromode  fastzeromode  plugin sees    fast zero  plugin sees
#   none      (any)         400 W          -          400 W
#   emulate   default       400 W          ENOTSUP    400 W
#             slow, probe   400 W          ENOTSUP    400 W
#             none          400 W          -          400 W
#             ignore        400 W          ok         600 W
#   notrim    default       200 W + 50 Z   ok         200 W + 1 fast Z
#   or plugin probe         200 W + 50 Z   ok         200 W + 1 fast Z
#             slow          200 W + 50 Z   ENOTSUP    200 W + 50 Z
#             none          200 W + 50 Z   -          200 W + 50 Z
#             ignore        200 W + 50 Z   ok         200 W + 1 Z
#
# (W: writes of 256 KiB; Z: zero requests, of 1 MiB, or of 100 MiB
# for the pre-zero; "-": fast zero not advertised, so not tried.)

# The size in MiB, even; the test sets a smaller one (the requests per
# MiB and the counts per case are the same at any size).
CM_SIZE_MIB=${CM_SIZE_MIB:-100}
cm_dir=$tmp/cm
mkdir -p "$cm_dir"
cm_src=$cm_dir/src.qcow2

# cm_make_source: the half-sparse source, $cm_src.
cm_make_source ()
{
  local args=() i
  qemu-img create -q -f qcow2 "$cm_src" "${CM_SIZE_MIB}M" ||
    fail "qemu-img create $cm_src"
  for (( i = 0; i < CM_SIZE_MIB; i += 2 )); do
    args+=(-c "write -P $(( i / 2 % 255 + 1 )) ${i}M 1M")
  done
  qemu-io -f qcow2 "${args[@]}" "$cm_src" > "$cm_dir/qemu-io.out" 2>&1 || {
    cat "$cm_dir/qemu-io.out" >&2
    fail "qemu-io writing $cm_src"
  }
}

# The client, run by nbdkit --run: copy.sh URI CLIENT SRC TIMEFILE
# PREZEROFILE.  The copy is timed: the pre-zero's request (not nbdsh's
# start and connection: qemu-img sent it on the connection it copies
# over) plus the whole qemu-img convert.  Then the export is compared
# with the source through NBD (the memory plugin's data is gone once
# nbdkit exits).  The compare's reads go through iostats too: reads
# are not asserted.
cat > "$cm_dir/copy.sh" <<'EOF'
set -e
uri=$1 client=$2 src=$3 timefile=$4 prezerofile=$5
tiz= pz_time=0
if [ "$client" = prezero ]; then
  /usr/bin/nbdsh -u "$uri" -c '
import errno, time
if not h.can_fast_zero():
    print("none 0")
else:
    t = time.monotonic()
    try:
        h.zero(h.get_size(), 0, nbd.CMD_FLAG_FAST_ZERO)
        r = "ok"
    except nbd.Error as e:
        if e.errnum != errno.ENOTSUP:
            raise
        r = "ENOTSUP"
    print(r, time.monotonic() - t)
' > "$prezerofile.out"
  read -r pz pz_time < "$prezerofile.out"
  echo "$pz" > "$prezerofile"
  if [ "$pz" = ok ]; then tiz=--target-is-zero; fi
fi
start=$(date +%s.%N)
qemu-img convert -n $tiz -f qcow2 -O raw "$src" "$uri"
end=$(date +%s.%N)
echo "$start $end $pz_time" > "$timefile"
qemu-img compare -q -f qcow2 -F raw "$src" "$uri" ||
  { echo "the export differs from $src" >&2; exit 1; }
EOF

# cm_run PLUGIN ZEROMODE FASTZEROMODE CLIENT: run one case.  Leaves
# the log in $cm_dir/log, iostats' JSON in $cm_dir/stats.json, the
# pre-zero's outcome in $cm_dir/prezero, the qcow2 image in
# $cm_dir/dst.qcow2 and its qemu-img check in $cm_dir/check.json, and
# sets cm_elapsed to the copy's seconds.  The copy must succeed and the
# export must equal the source; a qcow2 image must also compare equal
# to the source afterwards, read by qemu, and pass qemu-img check.
cm_run ()
{
  local plugin="$1" zm="$2" fm="$3" client="$4"
  local what="$plugin zeromode=$zm fastzeromode=$fm $client"
  local target lat_filter=() lat_args=() dst=$cm_dir/dst.qcow2 run
  rm -f "$cm_dir/log" "$cm_dir/stats.json" "$cm_dir/time" "$cm_dir/prezero"*
  echo skip > "$cm_dir/prezero"
  case "$plugin" in
    memory) target=(memory "${CM_SIZE_MIB}M") ;;
    qcow2)
      rm -f "$dst"
      qemu-img create -q -f qcow2 "$dst" "${CM_SIZE_MIB}M" ||
        fail "qemu-img create $dst"
      target=(qcow2 "$dst") ;;
    *) fail "cm_run: unknown plugin $plugin" ;;
  esac
  # shellcheck disable=SC2016 # $uri is for nbdkit's shell
  printf -v run 'bash %q "$uri" %q %q %q %q' "$cm_dir/copy.sh" "$client" \
    "$cm_src" "$cm_dir/time" "$cm_dir/prezero"
  if [ -n "${CM_LATENCY:-}" ]; then
    lat_filter=(--filter=latency)
    read -r -a lat_args <<< "$CM_LATENCY"
  fi
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - \
    --filter=log --filter=fastzero --filter=blocksize "${lat_filter[@]}" \
    --filter=iostats --filter=noextents "${target[@]}" \
    zeromode="$zm" fastzeromode="$fm" maxdata=256k \
    logfile="$cm_dir/log" \
    iostats-file="$cm_dir/stats.json" iostats-format=json \
    "${lat_args[@]}" \
    --run "$run" \
    > "$cm_dir/run.out" 2>&1 || {
    cat "$cm_dir/run.out" >&2
    fail "$what: the copy failed"
  }
  cm_elapsed=$(awk '{ printf "%.3f", $2 - $1 + $3 }' "$cm_dir/time")
  if [ "$plugin" = qcow2 ]; then
    qemu-img check --output=json "$dst" > "$cm_dir/check.json" || {
      cat "$cm_dir/check.json" >&2
      fail "$what: qemu-img check $dst"
    }
    qemu-img compare -q -f qcow2 -F qcow2 "$cm_src" "$dst" ||
      fail "$what: $dst differs from the source"
  fi
}

# cm_expect ZEROMODE FASTZEROMODE CLIENT: the counts the case must
# show, from nbdkit-fastzero-filter(1) and what qemu-img sends (above).
# Sets:
#   adv_zero adv_fast   zero and fast zero advertised (0 or 1), as the
#                       log's Connect line shows them
#   prezero             the pre-zero's outcome: skip (client convert),
#                       none (fast zero not advertised), ok, ENOTSUP
#   c_writes c_zeroes   the client's writes and (not fast) zeroes,
#                       1 MiB each
#   c_fast_ok c_fast_enotsup   the client's fast zeroes, by outcome
#   p_writes            writes reaching the plugin, 256 KiB each
#   p_fast_ok p_slow_ok zero requests reaching the plugin, with and
#                       without the fast flag (none fails)
#   p_zero_mib          their MiB
#   clusters            a qcow2 target's allocated 64 KiB clusters
cm_expect ()
{
  local zm="$1" fm="$2" client="$3" holes=$(( CM_SIZE_MIB / 2 ))
  local data=$(( CM_SIZE_MIB / 2 )) pieces=4   # 1 MiB / 256 KiB

  # zeromode=none offers no zeroes, fast or not, whatever fastzeromode
  # says; the others offer zeroes (fastzero says it zeroes natively).
  # Fast zeroes are offered unless fastzeromode=none: slow, ignore and
  # probe offer them, and so does default, with emulate by itself and
  # with notrim and plugin because both plugins offer them (memory
  # does; qcow2 says so in plugin_can_fast_zero).
  adv_zero=1 adv_fast=1
  [ "$zm" != none ] || adv_zero=0 adv_fast=0
  [ "$fm" != none ] || adv_fast=0

  # The pre-zero: one fast zero of the whole export.
  #  - slow fails every fast zero at once, with ENOTSUP;
  #  - default with emulate does the same;
  #  - probe finds no range known to read as zeroes (noextents), and
  #    then fails with emulate (writing is never fast), and passes the
  #    request to the plugin with notrim and plugin, both plugins
  #    zeroing natively and fast;
  #  - default with notrim or plugin passes it to the plugin;
  #  - ignore treats it as a zero without the fast flag, which always
  #    succeeds (with emulate: written, all 100 MiB of it).
  # The plugins succeed: memory zeroes any range; qcow2 zeroes whole
  # clusters of a v3 image with zero clusters, and a fresh image has
  # no L2 table to change at all.
  prezero=skip
  if [ "$client" = prezero ]; then
    if [ "$adv_fast" = 0 ]; then
      prezero=none
    else
      case "$zm:$fm" in
        *:slow | emulate:default | emulate:probe) prezero=ENOTSUP ;;
        *) prezero=ok ;;
      esac
    fi
  fi
  c_fast_ok=0 c_fast_enotsup=0
  [ "$prezero" != ok ] || c_fast_ok=1
  [ "$prezero" != ENOTSUP ] || c_fast_enotsup=1
  # After a successful pre-zero, --target-is-zero skips the holes.
  [ "$prezero" != ok ] || holes=0

  # The convert: a write per data MiB; per hole a zero if zeroes are
  # offered, else a write of zero bytes.
  if [ "$adv_zero" = 1 ]; then
    c_writes=$data c_zeroes=$holes
  else
    c_writes=$(( data + holes )) c_zeroes=0
  fi

  # Below fastzero and blocksize: each 1 MiB write is 4 writes of
  # 256 KiB.  emulate turns each zero into writes of the same bytes (at
  # most 64 MiB each, then cut to 256 KiB by blocksize): 4 per hole,
  # and 400 for an ignored pre-zero.  notrim and plugin pass zeroes to
  # the plugin: one per hole, and the pre-zero, with its fast flag
  # (default, probe) or without it (ignore).  Refused fast zeroes never
  # get past fastzero, so the plugin sees no ENOTSUP.
  p_writes=$(( c_writes * pieces )) p_fast_ok=0 p_slow_ok=0 p_zero_mib=0
  if [ "$zm" = emulate ]; then
    p_writes=$(( p_writes + c_zeroes * pieces ))
    [ "$prezero" != ok ] || p_writes=$(( p_writes + CM_SIZE_MIB * pieces ))
  else
    p_slow_ok=$c_zeroes p_zero_mib=$c_zeroes
    if [ "$prezero" = ok ]; then
      if [ "$fm" = ignore ]; then
        p_slow_ok=$(( p_slow_ok + 1 ))
      else
        p_fast_ok=1
      fi
      p_zero_mib=$(( p_zero_mib + CM_SIZE_MIB ))
    fi
  fi

  # A qcow2 target: zero bytes written as data allocate their clusters
  # like any data (none, emulate): all 1600.  Zero requests on a fresh
  # image allocate nothing, with or without MAY_TRIM (the plugin keeps
  # an allocation it has, and there is none): only the data's 800.
  case "$zm" in
    none | emulate) clusters=$(( CM_SIZE_MIB * 16 )) ;;
    *) clusters=$(( data * 16 )) ;;
  esac
}

# cm_check PLUGIN ZEROMODE FASTZEROMODE CLIENT: after cm_run, check
# the log, iostats and the qcow2 image against cm_expect.
cm_check ()
{
  local plugin="$1" zm="$2" fm="$3" client="$4"
  local what="$plugin zeromode=$zm fastzeromode=$fm $client"
  local check=
  cm_expect "$zm" "$fm" "$client"
  [ "$plugin" != qcow2 ] || check=$cm_dir/check.json
  [ "$(cat "$cm_dir/prezero")" = "$prezero" ] ||
    fail "$what: pre-zero $(cat "$cm_dir/prezero"), expected $prezero"
  /usr/bin/python3 - "$cm_dir/log" "$cm_dir/stats.json" "$check" \
    "$clusters" "$adv_zero" "$adv_fast" "$c_writes" "$c_zeroes" \
    "$c_fast_ok" "$c_fast_enotsup" "$p_writes" "$p_fast_ok" "$p_slow_ok" \
    "$p_zero_mib" <<'EOF' || fail "$what: unexpected counts (above)"
import json, re, sys
log, stats, check = sys.argv[1:4]
(clusters, adv_zero, adv_fast, c_writes, c_zeroes, c_fast_ok, c_fast_enotsup,
 p_writes, p_fast_ok, p_slow_ok, p_zero_mib) = map(int, sys.argv[4:])
MiB, KiB = 1 << 20, 1 << 10
bad = []
def want(what, got, exp):
    if got != exp:
        bad.append("%s: %r, expected %r" % (what, got, exp))

# The client's side, from the log filter above fastzero.
lines = open(log).read().splitlines()
conns = [l for l in lines if " Connect " in l]
if not conns:
    bad.append("no Connect in the log")
for l in conns:
    z = int(re.search(r" zero=(\d)", l).group(1))
    f = int(re.search(r" fast_zero=(\d)", l).group(1))
    want("zero advertised", int(z != 0), adv_zero)
    want("fast zero advertised", f, adv_fast)
reqs, results = {}, {}
for l in lines:
    m = re.search(r"connection=(\d+) (Write|Zero|Trim) id=(\d+) (.*) \.\.\.$", l)
    if m:
        reqs[(m[1], m[3])] = (m[2], dict(kv.split("=") for kv in m[4].split()))
    m = re.search(r"connection=(\d+) \.\.\.(Write|Zero|Trim) id=(\d+) (.*)$", l)
    if m:
        results[(m[1], m[3])] = m[4]
writes = [a for k, a in reqs.values() if k == "Write"]
zeroes = [a for k, a in reqs.values() if k == "Zero" and a["fast"] == "0"]
fast = [(key, a) for key, (k, a) in reqs.items()
        if k == "Zero" and a["fast"] == "1"]
want("client trims", sum(k == "Trim" for k, a in reqs.values()), 0)
want("client writes", len(writes), c_writes)
want("client write sizes", {int(a["count"], 16) for a in writes},
     {MiB} if writes else set())
want("client zeroes", len(zeroes), c_zeroes)
want("client zero sizes and MAY_TRIM",
     {(int(a["count"], 16), a["trim"]) for a in zeroes},
     {(MiB, "1")} if zeroes else set())
fast_results = [results.get(key) for key, a in fast]
want("client fast zeroes ok", fast_results.count("return=0"), c_fast_ok)
want("client fast zeroes ENOTSUP",
     fast_results.count("return=-1 error=ENOTSUP"), c_fast_enotsup)
want("client fast zeroes", len(fast), c_fast_ok + c_fast_enotsup)
want("other results", sorted({r for k, r in results.items()
                              if k not in dict(fast)}), ["return=0"])

# What reached the plugin, from iostats below fastzero.
ops = [json.loads(l) for l in open(stats)][-1]["ops"]
w, z = ops["write"], ops["zero"]
want("plugin writes", w["count"], p_writes)
want("plugin write bytes", w["bytes"], p_writes * 256 * KiB)
want("plugin zeroes", z["count"], p_fast_ok + p_slow_ok)
want("plugin zero bytes", z["bytes"], p_zero_mib * MiB)
want("plugin fast zeroes", z["fast"], {"ok": p_fast_ok, "ENOTSUP": 0})
want("plugin slow zeroes", z["slow"], {"ok": p_slow_ok, "ENOTSUP": 0})
want("plugin trims", ops["trim"]["count"], 0)
want("plugin extents", ops["extents"]["count"], 0)
for op in ops:
    want(op + " errors", ops[op]["errors"], {})

# A qcow2 image's allocation, from qemu-img check.
if check:
    want("allocated clusters",
         json.load(open(check))["allocated-clusters"], clusters)
if bad:
    print("\n".join(bad))
    sys.exit(1)
EOF
}

# cm_cases: the matrix, one "ZEROMODE FASTZEROMODE" per line; probe
# where fastzero accepts it (not with zeromode=none).
cm_cases ()
{
  local zm fm
  for zm in none emulate notrim plugin; do
    for fm in default none slow ignore probe; do
      [ "$zm:$fm" != none:probe ] || continue
      echo "$zm $fm"
    done
  done
}
