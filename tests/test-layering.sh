#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The engine's layering (common/qcow2/README's order, internal.h's
# circles and owned parts of struct qcow2_image), checked on the
# objects just built and the sources: see layering.py.
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
echo "OK"
