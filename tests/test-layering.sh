#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The engine's layering (common/qcow2/README's order, internal.h's
# circles and owned parts of struct qcow2_image), checked on the
# objects just built and the sources: see layering.py.  Then the rim's
# (the plugin and the qcow2 filter over the glue, over the backends,
# over the engine; and within each, file by file, in the order of its
# README): see layering-rim.py.
source "${srcdir:-.}/functions.sh"
requires nm python3

q="$abs_top_srcdir/common/qcow2"
archive="$abs_top_builddir/common/.libs/libqcow2.a"
[ -f "$archive" ] || fail "$archive not built"

python3 "$srcdir/layering.py" "$q/README" "$q/internal.h" "$archive" \
  "$q"/*.c || fail "the engine's layering is broken (see above)"

# The check must see what it checks: a call up the order and a write
# into another file's part are caught.
cat > "$tmp/up.c" <<'EOC'
int cache_get (void);
int log_error (void) { return cache_get (); }
EOC
cc -c -o "$tmp/libqcow2_la-log.o" "$tmp/up.c"
ar rc "$tmp/up.a" "$tmp/libqcow2_la-log.o"
{ ar x --output="$tmp" "$archive" libqcow2_la-cache.o &&
  ar rc "$tmp/up.a" "$tmp/libqcow2_la-cache.o"; } ||
  fail "cannot take cache.c's object out of $archive"
python3 "$srcdir/layering.py" "$q/README" "$q/internal.h" "$tmp/up.a" \
  > "$tmp/up.out" && fail "an upward call log.c -> cache.c passed"
grep -q "log.c -> cache.c" "$tmp/up.out" ||
  fail "the upward call is not named: $(cat "$tmp/up.out")"

printf 'void f (struct qcow2_image *img)\n{\n  img->alloc.free_hint = 0;\n}\n' \
  > "$tmp/write.c"
python3 "$srcdir/layering.py" "$q/README" "$q/internal.h" "$archive" \
  "$tmp/write.c" > "$tmp/write.out" && fail "a write of img->alloc passed"
grep -q "write.c:3: writes alloc, which alloc.c owns" "$tmp/write.out" ||
  fail "the write is not named: $(cat "$tmp/write.out")"
# The rim: the plugin's (whatever files it has), the filter's, the
# glue's and the backends' objects, each module's files in the order
# its README lists.
c="$abs_top_srcdir/common"
orders=()
for m in glue fileio nbdio memio; do
  orders+=("--order=$m=$c/$m/README")
done
shopt -s nullglob
plugin=("$abs_top_builddir"/plugins/qcow2/.libs/nbdkit_qcow2_plugin_la-*.o)
filter=("$abs_top_builddir"/filters/qcow2/.libs/nbdkit_qcow2_filter_la-*.o)
shopt -u nullglob
[ ${#plugin[@]} -gt 0 ] || fail "the plugin's objects are not built"
[ ${#filter[@]} -gt 0 ] || fail "the filter's objects are not built"
rim=("${plugin[@]}" "${filter[@]}"
     "$abs_top_builddir"/common/.libs/lib{glue,fileio,nbdio,memio}.a
     "$archive")
for o in "${rim[@]}"; do [ -f "$o" ] || fail "$o not built"; done
python3 "$srcdir/layering-rim.py" "${orders[@]}" "${rim[@]}" ||
  fail "the rim's layering is broken (see above)"

# It sees what it checks: a backend calling the glue, the filter's
# backend calling the overlay, the bottom of nbdio calling its top
# (nbdio's real objects but log.c's), a file its module's README does
# not list, and a circle between two files of the plugin are caught.
printf 'void glue_noticef (void);\nvoid fileio_f (void) { glue_noticef (); }\n' \
  > "$tmp/fileio.c"
cc -c -o "$tmp/libfileio_la-fileio.o" "$tmp/fileio.c"
printf '_Bool overlay_active (void);\n_Bool below_f (void) { return overlay_active (); }\n' \
  > "$tmp/below.c"
cc -c -o "$tmp/nbdkit_qcow2_filter_la-below.o" "$tmp/below.c"
printf 'void nbdio_reap (void);\nvoid nbdio_say (void) { nbdio_reap (); }\n' \
  > "$tmp/log.c"
cc -c -o "$tmp/libnbdio_la-log.o" "$tmp/log.c"
printf 'void nbdio_stray (void) { }\n' > "$tmp/stray.c"
cc -c -o "$tmp/libnbdio_la-stray.o" "$tmp/stray.c"
printf 'void b (void);\nvoid a (void) { b (); }\n' > "$tmp/a.c"
printf 'void a (void);\nvoid b (void) { a (); }\n' > "$tmp/b.c"
cc -c -o "$tmp/nbdkit_qcow2_plugin_la-a.o" "$tmp/a.c"
cc -c -o "$tmp/nbdkit_qcow2_plugin_la-b.o" "$tmp/b.c"
rm -f "$tmp/nbdio.a"
ar x --output="$tmp" "$abs_top_builddir/common/.libs/libnbdio.a" \
  libnbdio_la-conn.o || fail "cannot take conn.c's object out of libnbdio.a"
ar rc "$tmp/nbdio.a" "$tmp/libnbdio_la-conn.o" "$tmp/libnbdio_la-log.o" \
  "$tmp/libnbdio_la-stray.o"
python3 "$srcdir/layering-rim.py" "${orders[@]}" "$tmp/libfileio_la-fileio.o" \
  "$tmp/nbdkit_qcow2_filter_la-below.o" \
  "$abs_top_builddir"/filters/qcow2/.libs/nbdkit_qcow2_filter_la-overlay.o \
  "$abs_top_builddir"/common/.libs/libglue.a "$tmp/nbdio.a" \
  "$tmp/nbdkit_qcow2_plugin_la-a.o" "$tmp/nbdkit_qcow2_plugin_la-b.o" \
  > "$tmp/rim.out" && fail "upward calls in the rim passed"
for v in "fileio/fileio.c -> glue/log.c: glue_noticef" \
         "filter/below.c -> filter/overlay.c: overlay_active" \
         "nbdio/log.c -> nbdio/conn.c: nbdio_reap" \
         "nbdio/stray.c: a file of nbdio its order does not list" \
         "plugin: a circle between a.c, b.c"; do
  grep -qF "$v" "$tmp/rim.out" || fail "not named: $v: $(cat "$tmp/rim.out")"
done
echo "OK"
