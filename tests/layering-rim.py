#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# The rim's layering, checked as layering.py checks the engine's: every
# call (or reference) from one file of the rim to a function another
# file defines, as nm sees them in the objects built.  Module by module,
# top first:
#
#   plugin:   plugins/qcow2/*.c (qcow2.c > control*.c > fleet-control.c
#             > fleet.c > fleet-open.c > fleet-list.c > fleet-create.c
#             > image.c > fleet-names.c > gate.c, as plugin.h and fleet.h
#             say)
#   filter:   filters/qcow2/*.c (qcow2.c > start.c > create.c > config.c
#             > overlay.c > record.c > below.c, as filter.h says)
#   glue:     common/glue/*.c
#   backends: common/fileio, common/nbdio, common/memio (none calls
#             another)
#   engine:   common/qcow2 (layering.py checks within it)
#
# A module calls only the modules below it (the engine calls none of
# the rim).  Within a module:
#
# - no circle between its files;
# - where the module's order is given (--order MODULE=FILE: a README's
#   "From the bottom up" list, or a header's "From the top down" one,
#   each line of it a file's name first), each file calls only the
#   files it lists below it, and every file of the module is listed;
# - otherwise the plugin's and the filter's files known here go in
#   their order above; a file of theirs not known here is checked for
#   circles only.
#
# A name defined in two places (each module's own copy of the glue) is
# taken in its own module.  Each violation is printed; the exit status
# says if any.
#
# Usage: layering-rim.py [--order MODULE=FILE]... OBJECT-OR-ARCHIVE...
# (a file's module and name from its object: libglue_la-log.o is
# glue/log.c; nbdkit_qcow2_filter_la-below.o is filter/below.c)

import re
import subprocess
import sys

# Modules, top first; the backends share a rank.
RANK = {'plugin': 0, 'filter': 1, 'glue': 2,
        'fileio': 3, 'nbdio': 3, 'memio': 3, 'engine': 4}
# Orders known here, bottom first, for modules not given one.
KNOWN = {'plugin': ['gate.c', 'freeze.c', 'fleet-names.c', 'image.c', 'fleet-create.c',
                    'fleet-list.c', 'fleet-open.c', 'fleet.c', 'fleet-control.c',
                    'exports.c',
                    'qcow2.c'],
         'filter': ['below.c', 'record.c', 'overlay.c', 'config.c',
                    'create.c', 'start.c', 'qcow2.c']}


def source(member):
    """(module, file) an object member is built from, or None."""
    m = re.match(r'^(?:lib(glue|fileio|nbdio|memio|qcow2)|'
                 r'nbdkit_qcow2_(plugin|filter))_la-(.+)\.o$', member)
    if not m:
        return None
    module = m.group(1) or m.group(2)
    return ('engine' if module == 'qcow2' else module, m.group(3) + '.c')


def file_order(path):
    """The files a README or header lists, bottom first: after a line
    "From the bottom up" (to the end, or the comment's end) or "From the
    top down" (the same, reversed), the lines that start with a name."""
    order, listing, top_down = [], False, False
    for line in open(path):
        if not listing:
            m = re.search(r'From the (bottom up|top down)', line)
            if m:
                listing, top_down = True, m.group(1) == 'top down'
            continue
        if '*/' in line:
            break
        m = re.match(r'^\s*(?:\*\s+)?([a-z0-9-]+\.c)\s', line)
        if m:
            order.append(m.group(1))
    return order[::-1] if top_down else order


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


def circles(edges):
    """The files on a circle, as sets (Tarjan's strongly connected
    components of more than one file)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def name(src):
    return '%s/%s' % src


def main(argv):
    orders, paths = {}, []
    for arg in argv:
        m = re.match(r'^--order=?(\w+)=(.+)$', arg)
        if m:
            order = file_order(m.group(2))
            if not order:
                print('%s: no list of files found' % m.group(2))
                return 1
            orders[m.group(1)] = order
        else:
            paths.append(arg)
    defined, used = symbols(paths)
    bad = 0
    files = {s for homes in defined.values() for s in homes} | set(used)
    for src in sorted(files):
        if src[0] in orders and src[1] not in orders[src[0]]:
            print('%s: a file of %s its order does not list'
                  % (name(src), src[0]))
            bad += 1

    inner = {}                  # module -> {(a, b): [names]}
    for src in sorted(used):
        for sym in sorted(used[src]):
            homes = defined.get(sym, set())
            if not homes - {src} or src in homes:
                continue
            same = {h for h in homes if h[0] == src[0]}
            home = min(same or homes, key=lambda h: RANK[h[0]])
            if src[0] == home[0]:
                if src[0] != 'engine':
                    inner.setdefault(src[0], {}).setdefault(
                        (src[1], home[1]), []).append(sym)
            elif src[0] == 'engine':
                print('%s -> %s: %s: the engine calls the rim'
                      % (name(src), name(home), sym))
                bad += 1
            elif RANK[home[0]] <= RANK[src[0]]:
                print('%s -> %s: %s calls up (or across) the rim\'s order'
                      % (name(src), name(home), sym))
                bad += 1

    nedges = 0
    for module, edges in sorted(inner.items()):
        nedges += len(edges)
        order = orders.get(module, KNOWN.get(module, []))
        pos = {f: i for i, f in enumerate(order)}
        for (a, b), syms in sorted(edges.items()):
            if a in pos and b in pos and pos[b] > pos[a]:
                print('%s/%s -> %s/%s: %s: %s comes after it in %s\'s order '
                      '(an upward call)' % (module, a, module, b,
                                            ', '.join(syms), b, module))
                bad += 1
        for comp in circles(edges):
            print('%s: a circle between %s: %s' % (
                module, ', '.join(sorted(comp)),
                '; '.join('%s -> %s (%s)' % (a, b, ', '.join(s))
                          for (a, b), s in sorted(edges.items())
                          if a in comp and b in comp)))
            bad += 1
    print('%d files in %d modules, %d edges between files of a module: '
          '%d violations' % (len(files), len({f[0] for f in files}), nedges,
                             bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
