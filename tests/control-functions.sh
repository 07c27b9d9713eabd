# SPDX-License-Identifier: BSD-3-Clause
# Helpers of the control socket's tests (control=SOCKET).  Source after
# functions.sh and remote-functions.sh.

# Our QMP client, importable by the tests' Python.
export PYTHONPATH="${srcdir:-.}${PYTHONPATH:+:$PYTHONPATH}"

# control_serve NAME NBDKIT-ARGS...: nbdkit in the foreground of a
# background job, serving NBD on $tmp/NAME.sock with its control socket
# $tmp/NAME.qmp, its messages appended to $tmp/NAME.log, its pid in
# $tmp/NAME.pid (stopped at exit, or by stop_server NAME).
control_serve ()
{
  local name="$1"; shift
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"
  nbdkit -f -U "$tmp/$name.sock" -P "$tmp/$name.pid" "$@" \
    control="$tmp/$name.qmp" 2>> "$tmp/$name.log" &
  local pid=$!
  servers+=("$pid")
  disown "$pid"                 # killed by the test: no message
  wait_socket "$tmp/$name.sock" "$pid" && wait_socket "$tmp/$name.qmp" "$pid" ||
    { cat "$tmp/$name.log" >&2; fail "nbdkit $* did not start"; }
}

# wait_gone PATH: wait (up to 10 s) until PATH no longer exists.
wait_gone ()
{
  local i
  for i in $(seq 100); do [ -e "$1" ] || return 0; sleep 0.1; done
  return 1
}
