#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET against qemu-storage-daemon's QMP monitor: the same
# exchange, byte for byte, to both, and the replies compared.  The
# same: the greeting's shape, negotiation and its refusals, ids echoed,
# the error class of everything, and QEMU's words for the checks of a
# message and of arguments; framing (several messages in one write, one
# cut into bytes).  Differences, by design, each asserted below as it
# is:
#   - a JSON error's words after "JSON parse error, " are json-c's;
#   - QEMU offers the capability oob, we offer none ("Capability oob
#     not available"); a capability QEMU does not know it names
#     'null', we 'enable[0]';
#   - nested too deep, QEMU answers once for the depth and then once
#     for each bracket left; we answer once for the line;
#   - QEMU reads single-quoted strings (its extension), json-c only as
#     keys: a value 'x' is a JSON error here;
#   - QEMU refuses a key given twice, json-c keeps the last (the spec:
#     "unpredictable results");
#   - QEMU refuses a control character in a string, as JSON does;
#     json-c reads it (and we write it back escaped).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-storage-daemon
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

qemu-img create -q -f qcow2 "$tmp/disk.qcow2" 16M
control_serve ours qcow2 "$tmp/disk.qcow2"
qemu-storage-daemon --chardev socket,id=c0,path="$tmp/qsd.qmp",server=on,wait=off \
  --monitor chardev=c0 2> "$tmp/qsd.log" &
servers+=("$!")
disown "$!"
wait_socket "$tmp/qsd.qmp" "$!" || fail "qemu-storage-daemon did not start"

/usr/bin/python3 - "$tmp/ours.qmp" "$tmp/qsd.qmp" <<'PY' || fail "ours and QEMU's differ"
import sys
import qmpclient

ours, qemu = qmpclient.QMP(sys.argv[1]), qmpclient.QMP(sys.argv[2])

def both(data, n=1):
    """The replies of each to the same bytes."""
    ours.send_raw(data)
    qemu.send_raw(data)
    return ([ours.reply() for _ in range(n)], [qemu.reply() for _ in range(n)])

def same(data, n=1):
    o, q = both(data, n)
    for a, b in zip(o, q):
        assert a == b, (data, a, b)
    return o

def sync():
    """Both in step again: QEMU may answer more than once for a line
    (nothing else may come first but errors)."""
    for q in (ours, qemu):
        q.send_raw(b'\n{"execute": "qmp_capabilities", "id": "sync"}\n')
        while True:
            r = q.reply()
            if r.get("id") == "sync":
                break
            assert r["error"]["class"] == "GenericError", r

def error(r, cls, desc):
    assert r["error"] == {"class": cls, "desc": desc}, r

# The greeting: QEMU's shape (QEMU offers oob).
go, gq = ours.greeting["QMP"], qemu.greeting["QMP"]
assert sorted(go) == sorted(gq) == ["capabilities", "version"]
assert sorted(go["version"]) == sorted(gq["version"]) == ["package", "qemu"]
assert sorted(go["version"]["qemu"]) == sorted(gq["version"]["qemu"])
assert go["capabilities"] == [] and gq["capabilities"] == ["oob"]

# Before negotiation.
same(b'{"execute": "query-version", "id": 1}\n')
same(b'{"execute": "nothing"}\n')
same(b'{"execute": "qmp_capabilities", "arguments": {"x": 1}}\n')
same(b'{"execute": "qmp_capabilities", "arguments": {"enable": "oob"}, "id": 2}\n')
o, q = both(b'{"execute": "qmp_capabilities", "arguments": {"enable": ["x"]}}\n')
error(o[0], "GenericError", "Parameter 'enable[0]' does not accept value 'x'")
error(q[0], "GenericError", "Parameter 'null' does not accept value 'x'")
o = same(b'{"execute": "qmp_capabilities", "id": "n"}\n')
assert o[0] == {"return": {}, "id": "n"}, o

# After: the checks of a message, of arguments, of commands.
for data in [
        b'{"execute": "qmp_capabilities", "id": 3}\n',
        b'{"execute": "nothing", "id": {"a": [1]}}\n',
        b'{"execute": "query-version", "arguments": {"a": 1}, "id": 4}\n',
        b'[1, 2]\n', b'42\n', b'"x"\n', b'null\n', b'{}\n', b'{"id": 7}\n',
        b'{"execute": 1, "id": 8}\n',
        b'{"execute": "query-version", "arguments": 1, "id": 9}\n',
        b'{"execute": "query-version", "arguments": [], "id": 9}\n',
        b'{"execute": "query-version", "foo": 1, "id": 10}\n',
        b'{"execute": "query-version", "control": {}}\n',
        b'{"exec-oob": "query-version", "id": 11}\n',
        b'{"execute": "query-version", "exec-oob": "x"}\n']:
    same(data)
# JSON errors: the class, and QEMU's first words.
for data in [b'{"execute": }\n', b'\xff\n', b'xxxx\n', b'{"a": 1,}\n',
             b'{"execute": "query-version", "id": "\xc3"}\n']:
    o, q = both(data)
    assert o[0]["error"]["class"] == q[0]["error"]["class"] == "GenericError"
    assert o[0]["error"]["desc"].startswith("JSON parse error, "), o
    assert q[0]["error"]["desc"].startswith("JSON parse error, "), q
    sync()
# Too deep: the same first answer.
ours.send_raw(b"[" * 1100 + b"]" * 1100 + b"\n")
qemu.send_raw(b"[" * 1100 + b"]" * 1100 + b"\n")
error(ours.reply(), "GenericError", "JSON nesting depth limit exceeded")
error(qemu.reply(), "GenericError", "JSON nesting depth limit exceeded")
sync()

# Ids, any JSON value; framing.
for i in ["x", "", "\u00e9\U0001f4be\u0000", 0, -1, 2**63 - 1, 1.5, None,
          True, False, [], {}, [1, "a", {"b": [None]}]]:
    o, q = both(b'{"execute": "qmp_capabilities", "id": %s}\n'
                % qmpclient.json.dumps(i).encode())
    assert o[0]["id"] == q[0]["id"] == i, (i, o, q)
    error(o[0], "CommandNotFound",
          "Capabilities negotiation is already complete, command ignored")
    assert o == q, (o, q)
msgs = b"".join(b'{"execute": "query-commands", "id": %d}' % i for i in range(20))
o, q = both(msgs, 20)
assert [r["id"] for r in o] == [r["id"] for r in q] == list(range(20))
for a, b in zip(o, q):
    names = lambda r: {c["name"] for c in r["return"]}
    assert {"qmp_capabilities", "query-version", "query-commands"} <= \
        names(a) & names(b), (a, b)
one = b'{"execute": "qmp_capabilities", "id": "cut"}'
for k in range(len(one)):
    ours.send_raw(one[k:k + 1])
    qemu.send_raw(one[k:k + 1])
assert ours.reply() == qemu.reply()
o, q = both(b'{"execute": "query-version", "id": "v"}\n')
assert sorted(o[0]["return"]) == sorted(q[0]["return"]) == ["package", "qemu"]
assert o[0]["id"] == q[0]["id"] == "v"

# The differences of design, as they are.
o, q = both(b"{'execute': 'qmp_capabilities', 'id': 'q'}\n")
assert o[0]["error"]["desc"].startswith("JSON parse error, "), o
error(q[0], "CommandNotFound",
      "Capabilities negotiation is already complete, command ignored")
o, q = both(b'{"execute": "qmp_capabilities", "id": 1, "id": 2}\n')
assert o[0]["id"] == 2 and "error" in o[0], o
error(q[0], "GenericError", "JSON parse error, duplicate key")
o, q = both(b'{"execute": "qmp_capabilities", "id": "a\x01b"}\n')
assert o[0]["id"] == "a\x01b", o
assert q[0]["error"]["desc"].startswith("JSON parse error, "), q
sync()
PY
