#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The man pages' VERSION names the version configure gave (pod2man's
# step puts it in; roff escapes the dash): every page of a plugin or
# filter here, made where configure found pod2man.
source "${srcdir:-.}/functions.sh"
set -e
build=${abs_top_builddir:-$(cd .. && pwd)}
src=${abs_top_srcdir:-$(cd "${srcdir:-.}/.." && pwd)}
if [ "$(sed -n 's/^POD2MAN = //p' "$build/Makefile")" = no ]; then
  echo "$0: test skipped: configure found no pod2man: no man pages made"
  exit 77
fi
version=$(sed -n "s/^PACKAGE_VERSION = //p" "$build/Makefile")

n=0
for pod in "$src"/plugins/*/*.pod "$src"/filters/*/*.pod; do
  page=${pod#"$src"/}
  page=$build/${page%.pod}.1
  [ -f "$page" ] || fail "$page was not made from $pod"
  grep -q "^Part of nbdkit\\\\-qcow2 $version, built" "$page" ||
    fail "$page: VERSION does not name $version"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no man page source found in $src"
