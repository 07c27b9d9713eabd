# SPDX-License-Identifier: BSD-3-Clause
# The differential test against qemu-nbd (diffqemu.py), for the
# test-diff-qemu-*.sh scripts.  Source after write-functions.sh.
#
# diff_qemu NAME MAKE [PLUGIN-ARGS...]: MAKE PREFIX builds an image as
# PREFIX.qcow2 (with any data file beside it, named from PREFIX); it is
# called twice, for our copy and qemu-nbd's.  The same seeded stream of
# requests goes to both servers (diffqemu.py), then qemu-img compare
# must find the two images identical and qemu-img check both clean.
# DIFFQEMU_SEED (a number) and DIFFQEMU_OPS override the seed (by
# default one per case, printed) and the number of requests;
# diffqemu_args adds options of diffqemu.py.
diffqemu_py="$(cd "${srcdir:-.}" && pwd)/diffqemu.py"

diff_qemu ()
{
  local name="$1" make="$2"; shift 2
  local a=$tmp/$name-ours b=$tmp/$name-qemu sock=$tmp/$name.sock pid i r=0
  local seed=${DIFFQEMU_SEED:-$(printf %s "$name" | cksum | cut -d' ' -f1)}
  local cs
  $make "$a"
  $make "$b"
  cs=$(qemu-img info --output=json "$a.qcow2" |
         /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster-size"])')
  rm -f "$sock"
  qemu-nbd -t -e 16 -k "$sock" -f qcow2 --cache=writeback \
    --discard=unmap --detect-zeroes=off "$b.qcow2" 2>"$tmp/qemu-nbd.err" &
  pid=$!
  wait_socket "$sock" "$pid" ||
    { cat "$tmp/qemu-nbd.err" >&2; fail "$name: qemu-nbd did not start"; }
  echo "== $name (seed $seed)"
  timeout -k 10 "${TEST_TIMEOUT:-300}" \
    nbdkit -U - qcow2 "file=$a.qcow2" "$@" --run "/usr/bin/python3 \
      $diffqemu_py \"\$uri\" \"nbd+unix:///?socket=$sock\" --seed $seed \
      --ops ${DIFFQEMU_OPS:-250} --cluster-size $cs ${diffqemu_args:-}" ||
    r=$?
  kill "$pid"
  wait "$pid" || :
  [ $r -eq 0 ] || fail "$name: ours and qemu-nbd differ (DIFFQEMU_SEED=$seed)"
  qemu-img compare -q "$a.qcow2" "$b.qcow2" ||
    fail "$name: the two images differ after the run (DIFFQEMU_SEED=$seed)"
  for i in "$a" "$b"; do
    qemu-img check -q "$i.qcow2" ||
      fail "$name: qemu-img check $i.qcow2 exit $?"
  done
}
