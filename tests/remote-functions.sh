# SPDX-License-Identifier: BSD-3-Clause
# Local servers for the tests of backing files on remote storage,
# started by the test and stopped at its exit: nbdkit serving over NBD
# (a Unix socket, or TCP on the loopback address), and an HTTP server
# that answers Range requests (range-server.py).  Source after
# functions.sh.

servers=()
trap 'for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT

# free_port: a TCP port nothing listens on now.
free_port ()
{
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# nbd_server NAME NBDKIT-ARGS...: nbdkit serving on $tmp/NAME.sock, its
# pid in $tmp/NAME.pid (stopped at exit, or by stop_server NAME).
# With -p PORT among the arguments it listens on 127.0.0.1:PORT.
nbd_server ()
{
  local name="$1"; shift
  local pid i
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"
  case " $* " in
    *" -p "*)
      nbdkit -i 127.0.0.1 -P "$tmp/$name.pid" "$@" ;;
    *)
      nbdkit -U "$tmp/$name.sock" -P "$tmp/$name.pid" "$@" ;;
  esac || fail "nbdkit $* did not start"
  for i in $(seq 100); do [ -s "$tmp/$name.pid" ] && break; sleep 0.1; done
  pid=$(cat "$tmp/$name.pid")
  servers+=("$pid")
  case " $* " in
    *" -p "*) ;;
    *) wait_socket "$tmp/$name.sock" "$pid" || fail "nbdkit $* did not listen" ;;
  esac
}

# stop_server NAME: stop it, and wait until it is gone.
stop_server ()
{
  local pid i
  pid=$(cat "$tmp/$1.pid")
  kill "$pid" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

# http_server DIR [PEMFILE]: serve DIR over HTTP with Range requests
# (HTTPS with PEMFILE's certificate and key) on 127.0.0.1:$http_port.
http_server ()
{
  local i
  rm -f "$tmp/http.port"
  /usr/bin/python3 "${srcdir:-.}/range-server.py" "$1" "$tmp/http.port" ${2:+"$2"} &
  servers+=("$!")
  for i in $(seq 100); do [ -s "$tmp/http.port" ] && break; sleep 0.1; done
  http_port=$(cat "$tmp/http.port") || fail "the HTTP server did not start"
}

# start_sshd: an sshd of our own on 127.0.0.1:$ssh_port (a throwaway
# host key, stopped at exit) that lets this user in with
# $tmp/user_key; $tmp/known_hosts knows its host key.
start_sshd ()
{
  local i
  # sshd refuses to start without its privilege separation folder.
  [ "$(id -u)" -ne 0 ] || mkdir -p /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$tmp/user_key"
  cp "$tmp/user_key.pub" "$tmp/authorized_keys"
  ssh_port=$(free_port)
  cat > "$tmp/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $ssh_port
HostKey $tmp/host_key
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
CONF
  /usr/sbin/sshd -f "$tmp/sshd_config" -E "$tmp/sshd.log"
  for i in $(seq 50); do [ -s "$tmp/sshd.pid" ] && break; sleep 0.1; done
  [ -s "$tmp/sshd.pid" ] || fail "sshd did not start: $(cat "$tmp/sshd.log")"
  servers+=("$(cat "$tmp/sshd.pid")")
  echo "[127.0.0.1]:$ssh_port $(cat "$tmp/host_key.pub")" > "$tmp/known_hosts"
}
