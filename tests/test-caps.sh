#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The caps of the house style, checked on the product's sources (the C
# files and headers of common/, plugins/ and filters/: what the plugin
# and the filters are built from; tests, fuzz and bench are harnesses):
# no file over 900 lines, no function over 100 (see caps.py).  First,
# that the check sees what it checks, on planted files.
source "${srcdir:-.}/functions.sh"
requires python3

caps_py=$(cd "$srcdir" && pwd)/caps.py
caps () { python3 "$caps_py" "$@"; }

# A function of n lines in GNU style, from its name's line to its
# closing brace, with what could mislead a counter: an attribute line,
# braces in a string, a character constant and comments (one with a
# brace at the start of a line), and an initializer, a struct and a
# macro holding a brace before it.
function_of ()
{
  local name=$1 n=$2 i
  cat <<EOC
struct TSA_CAPABILITY ("mutex") lk { int m; };
static const int table_$name[] = { 1, 2 };
#define OPEN \\
  {
/* A comment
} at the start of a line. */
static int
$name (int x)
  TSA_REQUIRES (l)
{
  const char *s = "{{ not a brace";
  char c = '}';
EOC
  for ((i = 0; i < n - 9; i++)); do
    printf '  x += %d; /* } */\n' "$i"
  done
  printf '  (void) s;\n  (void) c;\n  return x;\n}\n'
}

function_of hundred 100 > "$tmp/ok.c"
function_of hundred_one 101 > "$tmp/long.c"
caps "$tmp/ok.c" > "$tmp/ok.out" ||
  fail "a 100-line function was refused: $(cat "$tmp/ok.out")"
grep -q '^1 files, 1 functions: 0 over' "$tmp/ok.out" ||
  fail "the 100-line function was not found: $(cat "$tmp/ok.out")"
caps "$tmp/long.c" > "$tmp/long.out" && fail "a 101-line function passed"
grep -qF "long.c:8: hundred_one is 101 lines (at most 100)" "$tmp/long.out" ||
  fail "the 101-line function is not named: $(cat "$tmp/long.out")"

seq 900 | sed 's/^/\/\/ line /' > "$tmp/lines900.h"
seq 901 | sed 's/^/\/\/ line /' > "$tmp/lines901.h"
caps "$tmp/lines900.h" > "$tmp/900.out" ||
  fail "a 900-line file was refused: $(cat "$tmp/900.out")"
caps "$tmp/lines901.h" > "$tmp/901.out" && fail "a 901-line file passed"
grep -qF "lines901.h: 901 lines (at most 900)" "$tmp/901.out" ||
  fail "the 901-line file is not named: $(cat "$tmp/901.out")"

# Braces that do not balance are an error, not a guess.
printf '%s\n' 'int' 'f (void)' '{' '#if A' '  if (a) {' '#else' \
  '  if (b) {' '#endif' '  }' '}' > "$tmp/unbalanced.c"
r=0
caps "$tmp/unbalanced.c" > "$tmp/unbalanced.out" || r=$?
[ "$r" -eq 2 ] && grep -q "cannot be read as C" "$tmp/unbalanced.out" ||
  fail "unbalanced braces passed (exit $r): $(cat "$tmp/unbalanced.out")"

# The product.
mapfile -t sources < <(cd "$abs_top_srcdir" &&
                       find common plugins filters -name '*.[ch]' | sort)
[ ${#sources[@]} -gt 50 ] || fail "only ${#sources[@]} sources found"
cd "$abs_top_srcdir"
caps "${sources[@]}" || fail "the caps are broken (see above)"
echo "OK"
