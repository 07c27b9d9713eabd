#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# json: backing file names read as QEMU reads them, qemu-img the
# oracle: for each spelling an image naming it as its backing file,
# which qemu-img convert and nbdkit must both read, the same bytes, or
# both refuse, ours with its reason on one line.  Among the spellings:
# what json-c reads its own way and QEMU refuses (a key given twice,
# NaN, numbers JSON has not, control characters, bad UTF-8, half a
# surrogate pair), past our bounds, and what we refuse on purpose
# where QEMU reads it (single quotes, a NUL, a key given twice by
# nesting and by a dot).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

# Backing files, each with its own bytes, named with what the names
# spell: a tab, a control character, DEL, UTF-8, bytes that are not
# UTF-8, QEMU's encoding of a NUL (C0 80).
d=$tmp/d
mkdir "$d"
files=(base $'t\tb' $'c\x01c' $'d\x7fd' $'e\xc3\xa9\xf0\x9f\x98\x80 f'
       $'x\xffy' $'s\xed\xa0\x80s' $'o\xc0\x80o')
for i in "${!files[@]}"; do
  qemu-img create -q -f raw "$d/${files[i]}.raw" 1M
  QIO_FMT=raw qio "$d/${files[i]}.raw" "write -P $((i + 1)) 0 1M" \
    "write -P $((i + 0x81)) $((i * 4096)) 4k"
done
# The top image: a cluster of its own over whatever it names.
qemu-img create -q -f qcow2 -b "$d/base.raw" -F raw "$tmp/top0.qcow2" 1M
qio "$tmp/top0.qcow2" 'write -P 0x55 128k 64k'

file='"file":{"driver":"file","filename":"'$d/base.raw'"}'

# agree WANT NAME: the top image names NAME (format raw).  WANT is
# "read": both read it, the same bytes; or an extended regexp: both
# refuse it, nbdkit with one error matching it; or "qemu-only REGEXP":
# QEMU reads it, we refuse it so, on purpose.
n=0
agree ()
{
  local want=$1 name=$2 top=$tmp/top.qcow2 q=0 o=0
  n=$((n + 1))
  rm -f "$tmp/q.raw" "$tmp/o.raw"
  cp "$tmp/top0.qcow2" "$top"
  qemu-img rebase -u -f qcow2 -b "$name" -F raw "$top" ||
    fail "case $n: qemu-img rebase -u -b '$name'"
  qemu-img convert -f qcow2 -O raw "$top" "$tmp/q.raw" 2> "$tmp/q.err" || q=$?
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - qcow2 "file=$top" \
    --run 'nbdcopy "$uri" '"$tmp/o.raw" 2> "$tmp/o.err" || o=$?
  [ "$o" -lt 124 ] || fail "case $n: nbdkit timed out or crashed ($o): $name"
  case $want in
    read)
      [ "$q" -eq 0 ] || fail "case $n: qemu-img does not read '$name': $(cat "$tmp/q.err")"
      [ "$o" -eq 0 ] || fail "case $n: nbdkit does not read '$name': $(cat "$tmp/o.err")"
      cmp "$tmp/q.raw" "$tmp/o.raw" ||
        fail "case $n: nbdkit reads '$name' otherwise than qemu-img"
      return ;;
    qemu-only\ *)
      [ "$q" -eq 0 ] || fail "case $n: qemu-img no longer reads '$name': $(cat "$tmp/q.err")"
      want=${want#qemu-only } ;;
    *)
      [ "$q" -ne 0 ] || fail "case $n: qemu-img reads '$name', which nbdkit is to refuse" ;;
  esac
  [ "$o" -ne 0 ] || fail "case $n: nbdkit reads '$name', expected /$want/"
  grep -Eq -- "$want" "$tmp/o.err" ||
    fail "case $n: '$name': nbdkit's error does not match /$want/: $(cat "$tmp/o.err")"
  [ "$(grep -c ' error: ' "$tmp/o.err")" -eq 1 ] ||
    fail "case $n: '$name': not one error: $(cat "$tmp/o.err")"
  message_shape "$tmp/o.err" || fail "case $n: '$name': not nbdkit's messages"
}

# Read alike: nested and dotted, JSON's whitespace, escapes (a
# surrogate pair, control characters), UTF-8, raw's window, -0.
agree read 'json:{"driver":"raw",'"$file"'}'
agree read 'json:{"driver":"raw","file.driver":"file","file.filename":"'$d/base.raw'"}'
agree read $'json: {"driver" :\t"raw",\r\n "file": {"filename": "'$d/base.raw$'"} }\n'
agree read 'json:{"driver":"raw","file":{"driver":"file","filename":"'"${d//\//\\/}"'\/e\u00e9\ud83d\ude00\u0020f.raw"}}'
agree read 'json:{"driver":"raw","file":{"filename":"'"$d/${files[4]}"'.raw"}}'
agree read 'json:{"driver":"raw","file":{"filename":"'"$d"'/t\tb.raw"}}'
agree read 'json:{"driver":"raw","file":{"filename":"'"$d"'/c\u0001c.raw"}}'
agree read 'json:{"driver":"raw","file":{"filename":"'"$d/${files[3]}"'.raw"}}'
agree read 'json:{"driver":"raw","offset":8192,"size":"524288",'"$file"'}'
agree read 'json:{"driver":"raw","offset":-0,'"$file"'}'

# Refused alike.
agree 'a key is given twice in one object' \
  'json:{"driver":"raw","driver":"raw",'"$file"'}'
agree 'a key is given twice in one object' \
  'json:{"driver":"raw","file":{"filename":"'$d/base.raw'","filename":"'$d/base.raw'"}}'
agree 'control character 0x09 in a string' \
  'json:{"driver":"raw","file":{"filename":"'"$d/${files[1]}"'.raw"}}'
agree 'invalid UTF-8' 'json:{"driver":"raw","file":{"filename":"'"$d/${files[5]}"'.raw"}}'
agree 'invalid UTF-8' 'json:{"driver":"raw","file":{"filename":"'"$d/${files[6]}"'.raw"}}'
agree 'invalid UTF-8' $'json:{"driver":"raw","file":{"filename":"\xf4\x90\x80\x80"}}'
agree 'half a surrogate pair' 'json:{"driver":"raw","file":{"filename":"'$d'/\ud800.raw"}}'
agree 'half a surrogate pair' 'json:{"driver":"raw","file":{"filename":"'$d'/\udc00.raw"}}'
agree '"offset": expected a number' 'json:{"driver":"raw","offset":NaN,'"$file"'}'
agree 'bad number' 'json:{"driver":"raw","offset":-Infinity,'"$file"'}'
agree '"offset": the number is out of range' \
  'json:{"driver":"raw","offset":18446744073709551616,'"$file"'}'
agree 'bad number at "00,' 'json:{"driver":"raw","offset":00,'"$file"'}'
agree 'bad number' 'json:{"driver":"raw","offset":1.,'"$file"'}'
agree 'must be a non-negative integer, not "-5"' \
  'json:{"driver":"raw","offset":-5,'"$file"'}'
agree 'option "x" is not supported' 'json:{"driver":"raw","x":{},'"$file"'}'
agree 'option "" is not supported' 'json:{"driver":"raw","":1,'"$file"'}'
agree 'only "backing": null' 'json:{"driver":"raw","backing":{},'"$file"'}'
agree '"file" must be the options of the storage' 'json:{"driver":"raw","file":{}}'
agree 'arrays are not supported' 'json:{"driver":"raw","x":[1],'"$file"'}'
agree 'text after the object at "x"' 'json:{"driver":"raw",'"$file"'} x'
agree 'text after the object' $'json:{"driver":"raw",'"$file"$'}\f'
agree 'expected a value at "}"' 'json:{"driver":"raw",'"$file"',}'
agree "expected ',' or '}' at \"/\\*" 'json:{"driver":"raw",'"$file"'/* c */}'
agree "expected ',' or '}' at \"\"" 'json:{"driver":"raw",'"$file"
agree 'unterminated string' 'json:{"driver":"raw","file":{"filename":"'$d/base.raw
agree 'expected an object' 'json:[{"driver":"raw",'"$file"'}]'
agree 'objects nest more than 16 deep' \
  'json:{"driver":"raw",'"$file"',"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":{"x":1}}}}}}}}}}}}}}}}}'

# QEMU reads these; we refuse them on purpose: its extension of JSON,
# a NUL QEMU makes C0 80 of (and a raw C0 80: not UTF-8), a key given
# twice by nesting and a dot (QEMU takes the last), a number QEMU's
# options turn into a string of digits.
agree "qemu-only single quotes" \
  "json:{'driver':'raw','file':{'driver':'file','filename':'$d/base.raw'}}"
agree 'qemu-only \\u0000 or half a surrogate pair' \
  'json:{"driver":"raw","file":{"filename":"'$d'/o\u0000o.raw"}}'
agree 'qemu-only invalid UTF-8' \
  'json:{"driver":"raw","file":{"filename":"'"$d/${files[7]}"'.raw"}}'
agree 'qemu-only key "file.filename" is given twice' \
  'json:{"driver":"raw",'"$file"',"file.filename":"'$d/base.raw'"}'
agree 'qemu-only must be a non-negative integer, not "1e3"' \
  'json:{"driver":"raw","offset":1e3,'"$file"'}'
