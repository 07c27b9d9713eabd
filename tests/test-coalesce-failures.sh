#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# flush-coalesce over plugins that fail or cannot flush (the eval
# plugin over a file):
#  - a plugin that cannot flush keeps its own FUA: neither flush nor
#    FUA is offered, even with coalesce-fua=true;
#  - a failed plugin flush fails every client flush waiting on it and
#    makes nothing durable: the next flush goes to the plugin again.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh
requires_nbdkit_plugin eval

export disk=$tmp/eval.img fail=$tmp/fail count=$tmp/count
truncate -s 1M "$disk"
# The sanitizer runtime that ./nbdkit may preload is for nbdkit, not for
# the commands of the scripts (dd aborts under it).
clean='unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; '
eval_plugin=(eval thread_model='echo parallel' can_multi_conn='exit 0'
  get_size='echo 1M'
  pread="$clean"'dd if="$disk" skip=$4 count=$3 iflag=count_bytes,skip_bytes status=none'
  pwrite="$clean"'dd of="$disk" seek=$4 conv=notrunc oflag=seek_bytes status=none')

# A plugin without flush offers neither flush nor FUA, even with
# coalesce-fua=true.
timeout -k 10 60 nbdkit -U - --filter=flush-coalesce "${eval_plugin[@]}" \
  coalesce-fua=true \
  --run 'nbdsh -u "$uri" -c "assert not h.can_flush() and not h.can_fua()"' ||
  fail "a plugin without flush: flush or FUA offered"

# Four connections write, then flush together while the plugin's flush
# (0.5 s) fails: one plugin flush, and all four fail with EIO.  Then
# with the failure gone, a flush with nothing new written still reaches
# the plugin (the failed flush made nothing durable); the next one does
# not.
failing='
import errno, os, threading, nbd
hs = [nbd.NBD() for i in range(4)]
for i, c in enumerate(hs):
    c.connect_uri(os.environ["uri"])
    c.pwrite(b"\x05" * 4096, i * 4096)
open(os.environ["fail"], "w").close()
results = [None] * 4
def flush(i):
    try:
        hs[i].flush()
        results[i] = 0
    except nbd.Error as e:
        results[i] = e.errnum
ts = [threading.Thread(target=flush, args=(i,)) for i in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
def count():
    return len(open(os.environ["count"]).read())
print("results", results, "plugin flushes", count())
assert results == [errno.EIO] * 4, results
assert count() == 1, count()
os.unlink(os.environ["fail"])
hs[0].flush()
assert count() == 2, "after a failed flush, a flush did not reach the plugin"
hs[1].flush()
assert count() == 2
'
export failing
: > "$count"
timeout -k 10 60 nbdkit -U - --filter=flush-coalesce "${eval_plugin[@]}" \
  flush="$clean"'sleep 0.5; printf x >> "$count"; if [ -e "$fail" ]; then echo "EIO injected" >&2; exit 1; fi' \
  --run 'export uri; nbdsh -u "$uri" -c "$failing"' 2> "$tmp/err" || {
    cat "$tmp/err"
    fail "failed flushes"
  }
