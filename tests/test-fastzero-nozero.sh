#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# fastzero's zeromode= and fastzeromode= against nbdkit's own nozero
# filter, every pair, over the memory plugin and over our qcow2 plugin:
# the same zero and fast-zero support offered, the same requests
# succeeding or failing with ENOTSUP, the same requests reaching the
# plugin (the log filter below each), the same data afterwards.  The
# one intended difference: zeromode=emulate fastzeromode=ignore writes
# the zeroes, as nozero's manual says, where nbdkit 1.32's nozero fails
# the request.  Also: bad parameters and a plugin without zero support
# are refused, and the qcow2 images stay clean.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh

# Each run: data everywhere, then a zero (MAY_TRIM, libnbd's default),
# a zero with FUA and NO_HOLE, and a fast zero; what the client saw,
# the requests that reached the plugin and which 4K blocks read zero.
cat > "$tmp/client.py" <<'PY'
import errno
print("can_zero", h.can_zero(), "can_fast_zero", h.can_fast_zero())
h.pwrite(b"\x55" * 65536, 0)
if h.can_zero():
    h.zero(4096, 0)
    h.zero(4096, 8192, nbd.CMD_FLAG_FUA | nbd.CMD_FLAG_NO_HOLE)
    if h.can_fast_zero():
        try:
            h.zero(4096, 16384, nbd.CMD_FLAG_FAST_ZERO)
            print("fast zero: ok")
        except nbd.Error as e:
            print("fast zero:", errno.errorcode[e.errnum])
print("zero blocks", [o for o in range(0, 65536, 4096)
                      if h.pread(4096, o) == bytes(4096)])
PY

# run FILTER PLUGIN ARGS...: the client's view, then the log's
# requests (without timestamps), on stdout.
run ()
{
  local filter="$1" plugin="$2"; shift 2
  local target
  rm -f "$tmp/log"
  case "$plugin" in
    memory) target=(memory 1M) ;;
    qcow2)
      qemu-img create -q -f qcow2 "$tmp/img.qcow2" 1M
      target=(qcow2 "$tmp/img.qcow2") ;;
  esac
  timeout -k 10 60 nbdkit -U - --filter="$filter" --filter=log \
    "${target[@]}" logfile="$tmp/log" "$@" \
    --run 'nbdsh -u "$uri" -c "exec(open(\"'"$tmp"'/client.py\").read())"' ||
    fail "nbdkit --filter=$filter $plugin $*"
  grep -E ' (\.\.\.)?(Write|Zero|Trim|Flush) ' "$tmp/log" | cut -d' ' -f3-
  if [ "$plugin" = qcow2 ]; then
    qemu-img check -q "$tmp/img.qcow2" ||
      fail "qemu-img check after --filter=$filter $*"
  fi
}

for plugin in memory qcow2; do
  for zm in none emulate notrim plugin; do
    for fm in default none slow ignore; do
      args=(zeromode=$zm fastzeromode=$fm)
      run nozero $plugin "${args[@]}" > "$tmp/nozero.out"
      run fastzero $plugin "${args[@]}" > "$tmp/fastzero.out"
      what="$plugin ${args[*]}"
      case "$zm" in
        none)
          grep -q '^can_zero False can_fast_zero False$' "$tmp/fastzero.out" ||
            fail "$what: zeroes offered" ;;
        emulate)
          ! grep -q ' Zero ' "$tmp/fastzero.out" ||
            fail "$what: a zero request reached the plugin" ;;
        notrim)
          ! grep -q 'trim=1' "$tmp/fastzero.out" ||
            fail "$what: MAY_TRIM reached the plugin" ;;
      esac
      if [ "$zm $fm" = "emulate ignore" ]; then
        grep -q '^fast zero: ok$' "$tmp/fastzero.out" &&
          grep -q 'Write id=4 offset=0x4000 count=0x1000 fua=0 \.\.\.' \
            "$tmp/fastzero.out" ||
          { cat "$tmp/fastzero.out"; fail "$what: fast zero not written"; }
        grep -q '^zero blocks \[0, 8192, 16384\]$' "$tmp/fastzero.out" ||
          fail "$what: wrong data"
        continue
      fi
      diff -u "$tmp/nozero.out" "$tmp/fastzero.out" ||
        fail "$what: fastzero differs from nozero"
    done
  done
done

# notrim and plugin need the plugin's zero (here hidden by nozero).
for zm in notrim plugin; do
  timeout -k 10 60 nbdkit -U - --filter=fastzero --filter=nozero \
    memory 1M zeromode=$zm --run 'nbdsh -u "$uri" -c "pass"' \
    > /dev/null 2> "$tmp/err" && fail "zeromode=$zm without plugin zero served"
  grep -q "zeromode=$zm requires plugin zero support" "$tmp/err" ||
    { cat "$tmp/err"; fail "zeromode=$zm: no clear error"; }
done

expect_refused "unknown zeromode 'trim' \\(expected none, emulate, notrim or plugin\\)" \
  --filter=fastzero memory 1M zeromode=trim
expect_refused "unknown fastzeromode 'fast' \\(expected default, none, slow, ignore or probe\\)" \
  --filter=fastzero memory 1M fastzeromode=fast
expect_refused "unknown zerodetect 'yes' \\(expected off, on or unmap\\)" \
  --filter=fastzero memory 1M zerodetect=yes
expect_refused "fastzeromode=probe needs zeromode=emulate, notrim or plugin" \
  --filter=fastzero memory 1M fastzeromode=probe
expect_refused "zerodetect=unmap cannot be used with zeromode=emulate" \
  --filter=fastzero memory 1M zeromode=emulate zerodetect=unmap
