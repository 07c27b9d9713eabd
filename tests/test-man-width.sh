#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The man pages' verbatim lines (commands, output, units) fit 80
# columns, as in nbdkit's own pages: man prints them as they are, so a
# longer line runs past a terminal's edge or is cut.  Every page of a
# plugin or filter here; its text paragraphs are filled by man and may
# be of any length.  And podchecker finds nothing wrong in them.
# First, that the check sees what it checks, on a planted page.
source "${srcdir:-.}/functions.sh"
set -e
requires perl podchecker
src=${abs_top_srcdir:-$(cd "${srcdir:-.}/.." && pwd)}

# wide FILE...: "FILE:LINE: N columns" for each line of a verbatim
# paragraph (its first line indented) over 80 columns, tabs expanded;
# not in =begin/=end blocks (comments), nor before the first command.
wide ()
{
  perl -ne '
    BEGIN { $start = 1 }
    # A paragraph starts after a blank line; its first line says what
    # it is (a command, a verbatim paragraph, text).
    if (/^\s*$/) { $start = 1; next }
    if ($start) {
      $start = 0;
      if (/^=cut\b/) { $pod = 0 }
      elsif (/^=begin\b/) { $pod = 1; $hidden = 1 }
      elsif (/^=end\b/) { $hidden = 0 }
      elsif (/^=/) { $pod = 1 }
      $verbatim = $pod && !$hidden && /^[ \t]/;
    }
    if ($verbatim) {
      chomp;
      1 while s/^([^\t]*)\t/$1 . " " x (8 - length($1) % 8)/e;
      print "$ARGV:$.: ", length, " columns\n" if length > 80;
    }
  } continue {
    if (eof) { close ARGV; ($start, $pod, $hidden, $verbatim) = (1, 0, 0, 0) }
  ' "$@"
}

long=$(printf 'x%.0s' $(seq 80))
cat > "$tmp/planted.pod" <<EOF
=begin comment

 $long not a page's text

=end comment

=head1 NAME

planted - $long a text line, filled by man

=head1 EXAMPLES

 fits: $(printf 'y%.0s' $(seq 73))
 $long
	$(printf 't%.0s' $(seq 73))

=cut
EOF
got=$(wide "$tmp/planted.pod")
want="$tmp/planted.pod:14: 81 columns
$tmp/planted.pod:15: 81 columns"
[ "$got" = "$want" ] ||
  fail "the check on a planted page: got \"$got\", wanted \"$want\""

n=0
bad=
for pod in "$src"/plugins/*/*.pod "$src"/filters/*/*.pod; do
  w=$(wide "$pod")
  [ -z "$w" ] || bad+="$w"$'\n'
  podchecker "$pod" > "$tmp/podchecker.log" 2>&1 &&
    ! grep -v 'pod syntax OK' "$tmp/podchecker.log" ||
    fail "podchecker $pod: $(cat "$tmp/podchecker.log")"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no man page source found in $src"
bad=${bad%$'\n'}
[ -z "$bad" ] || fail "verbatim lines over 80 columns:
${bad//"$src"\//}"
