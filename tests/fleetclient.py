# SPDX-License-Identifier: BSD-3-Clause
"""A dir= server's client, for the fleet tests' Python parts:

    sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
    from fleetclient import connect, listing
"""
import nbd
import os
import re


def connect(sock, name):
    """A handle connected to export NAME of the server at SOCK."""
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h


def listing(sock):
    """{name: description} of NBD_OPT_LIST alone (no export opened)."""
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_unix(sock)
    got = {}
    h.opt_list(lambda name, desc: got.__setitem__(name, desc) or 0)
    h.opt_abort()
    return got


def fds_on(pid, path):
    """How many of process PID's descriptors are open on PATH."""
    n = 0
    for fd in os.listdir("/proc/%s/fd" % pid):
        try:
            n += os.readlink("/proc/%s/fd/%s" % (pid, fd)) == path
        except OSError:
            pass
    return n


def connections(log, before):
    """(made since, open now): connections nbdkit's log filter wrote to
    LOG, less the BEFORE made before the test's part began."""
    text = open(log).read()
    made = len(re.findall(r" Connect ", text))
    return made - before, made - len(re.findall(r" Disconnect ", text))
