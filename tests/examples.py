#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The examples of a document, as a shell script that runs them in
order, as they would be pasted: the ```sh blocks of a Markdown file,
or the verbatim paragraphs of a POD page's EXAMPLES section.  A
systemd unit there (a verbatim paragraph that is a [Unit]...) is not a
command: with --units, the script is instead the service of the units,
run as systemd would start it on its socket, through
systemd-socket-activate (ListenStream, StateDirectory and ExecStart),
and a connection to it.

  examples.py FILE [--units]"""
import re
import shlex
import sys


def markdown_blocks(text):
    return re.findall(r"^```sh\n(.*?)^```$", text, re.M | re.S)


def pod_blocks(text):
    m = re.search(r"^=head1 EXAMPLES\n(.*?)(?=^=head1 )", text, re.M | re.S)
    if not m:
        sys.exit("no EXAMPLES section")
    blocks, cur = [], []
    for line in m.group(1).split("\n"):
        if line.startswith(" "):
            cur.append(line[1:])
        elif line == "" and cur:
            cur.append("")
        else:
            if cur:
                blocks.append("\n".join(cur).strip("\n") + "\n")
            cur = []
    if cur:
        blocks.append("\n".join(cur).strip("\n") + "\n")
    return blocks


def unit_script(units):
    """The service of the units, started on its socket."""
    keys = {}
    for u in units:
        text = re.sub(r"\\\n\s*", " ", u)
        for line in text.split("\n"):
            k, _, v = line.partition("=")
            if v:
                keys[k.strip()] = v.strip()
    sock, cmd = keys["ListenStream"], keys["ExecStart"]
    out = ["# the systemd unit, started on its socket as systemd would"]
    if "StateDirectory" in keys:
        out.append("mkdir -p /var/lib/%s" % keys["StateDirectory"])
    out.append("systemd-socket-activate -l %s %s > unit.log 2>&1 &"
               % (shlex.quote(sock), cmd))
    out.append("unit=$!")
    out.append("for i in $(seq 100); do [ -S %s ] && break; sleep 0.1; done"
               % shlex.quote(sock))
    out.append('nbdinfo "nbd+unix:///?socket=%s"' % sock)
    out.append('nbdinfo --size "nbd+unix:///?socket=%s"' % sock)
    out.append("kill $unit")
    return "\n".join(out) + "\n"


def main():
    path = sys.argv[1]
    text = open(path).read()
    blocks = (markdown_blocks(text) if path.endswith(".md")
              else pod_blocks(text))
    if not any("nbdkit" in b for b in blocks):
        sys.exit("%s: no examples found" % path)
    units = [b for b in blocks if b.startswith("[Unit]")]
    if "--units" in sys.argv[2:]:
        if not units:
            sys.exit("%s: no systemd unit found" % path)
        print("# The systemd unit of %s." % path.split("/")[-1])
        print("set -ex")
        sys.stdout.write(unit_script(units))
        return
    print("# The examples of %s, in order." % path.split("/")[-1])
    print("set -ex")
    for b in blocks:
        if not b.startswith("[Unit]"):
            sys.stdout.write(b)


if __name__ == "__main__":
    main()
