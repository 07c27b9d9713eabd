#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# The rim's layering, checked as layering.py checks the engine's: every
# call (or reference) from one file of the plugin, the qcow2 filter, the
# glue or a backend to a function another file defines, as
# nm sees them in the objects built, must go down this order (each
# line a layer, its files in their own order, top first):
#
#   plugin:   plugins/qcow2/qcow2.c > fleet.c > fleet-open.c > fleet-list.c
#             > fleet-create.c > image.c > fleet-names.c > control.c
#             > control-qmp.c
#   filter:   filters/qcow2/qcow2.c > overlay.c > below.c
#   glue:     stream.c > glue.c > policy.c > log.c > parse.c
#             > password.c > introspect.c
#   backends: fileio.c, nbdio.c, memio.c (none calls another)
#             > beneath.c (fileio's opening beneath a folder)
#   engine:   common/qcow2 (layering.py checks within it)
#
# The plugin and the filter call the glue, the backends and the engine;
# the glue calls the backends and the engine; backends call the engine
# (its few helpers for them) and nothing above.  A name defined in two
# places (each module's own copy of the glue) is taken in its layer.
# Each violation is printed; the exit status says if any.
#
# Usage: layering-rim.py OBJECT-OR-ARCHIVE...  (a file's name from its
# object: libglue_la-glue.o is glue.c; a plugin's or filter's object,
# nbdkit_qcow2_filter_la-below.o, is filter/below.c)

import re
import subprocess
import sys

ORDER = [
    'plugin/qcow2.c', 'plugin/fleet.c', 'plugin/fleet-open.c',
    'plugin/fleet-list.c',
    'plugin/fleet-create.c', 'plugin/image.c', 'plugin/fleet-names.c',
    'plugin/control.c', 'plugin/control-qmp.c',
    'filter/qcow2.c', 'filter/overlay.c', 'filter/below.c',
    'glue/stream.c', 'glue/glue.c', 'glue/policy.c', 'glue/log.c',
    'glue/parse.c', 'glue/password.c', 'glue/introspect.c',
    'backend/fileio.c', 'backend/nbdio.c', 'backend/memio.c',
    'backend/beneath.c',
    'engine',
]
# Files of one rank: may not call each other.
BACKENDS = ('backend/fileio.c', 'backend/nbdio.c', 'backend/memio.c')
SAME_RANK = {b: ORDER.index(BACKENDS[0]) for b in BACKENDS}


def rank(name):
    return SAME_RANK.get(name, ORDER.index(name))


def source(member):
    """The file an object member is built from, named by its layer."""
    m = re.match(r'^(lib\w+?|nbdkit_qcow2_(plugin|filter))_la-(.+)\.o$',
                 member)
    if not m:
        return None
    lib, module, base = m.group(1), m.group(2), m.group(3) + '.c'
    if module:
        return module + '/' + base
    if lib == 'libglue':
        return 'glue/' + base
    if lib == 'libnbdio':
        return 'backend/nbdio.c'    # its files are one backend
    if lib in ('libfileio', 'libmemio'):
        return 'backend/' + base
    if lib == 'libqcow2':
        return 'engine'
    return None


def symbols(paths):
    defined, used = {}, {}
    for path in paths:
        out = subprocess.run(['nm', '-A', path], check=True,
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.match(r'^(?:[^:]*:)?([^:]+):\s*(?:[0-9a-f]+)?\s+'
                         r'([A-Za-z])\s+(\S+)$', line)
            if not m:
                continue
            member, kind, name = m.groups()
            src = source(member.rsplit('/', 1)[-1])
            if src is None:
                continue
            if kind == 'T':     # functions: data is no call
                defined.setdefault(name, set()).add(src)
            elif kind == 'U':
                used.setdefault(src, set()).add(name)
    return defined, used


def main(paths):
    defined, used = symbols(paths)
    bad = 0
    for src in sorted(used):
        for name in sorted(used[src]):
            homes = defined.get(name, set()) - {src}
            if not homes or src in defined.get(name, set()):
                continue
            home = min(homes, key=rank)
            if src != 'engine' and home != 'engine' and \
               rank(home) <= rank(src):
                print('%s -> %s: %s calls up (or across) the rim\'s order'
                      % (src, home, name))
                bad += 1
            elif src == 'engine' and home != 'engine':
                print('%s -> %s: %s: the engine calls the rim'
                      % (src, home, name))
                bad += 1
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
