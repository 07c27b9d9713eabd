#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# The engine's layering, checked: every call (or reference) from one
# engine file to a function another defines, as nm sees them in the
# objects of libqcow2.a, must go down the order of common/qcow2/README
# (to a file listed above) or be one of the circles internal.h names;
# and the parts of struct qcow2_image that internal.h gives to one file
# are written only by that file (and image.c, which sets them up at
# open).  Each violation is printed; the exit status says if any.
#
# Usage: layering.py README INTERNAL_H ARCHIVE SOURCE...

import re
import subprocess
import sys


def readme_order(path):
    """The engine's files from the bottom up, as the README lists them."""
    order = []
    listing = False
    for line in open(path):
        if line.startswith('From the bottom up'):
            listing = True
        elif listing:
            m = re.match(r'^([a-z0-9-]+\.c)\s', line)
            if m:
                order.append(m.group(1))
    return order


def circles(path):
    """The allowed two-way edges, from internal.h's opening comment:
    lines "- a.c <-> b.c: why"."""
    allowed = set()
    for m in re.finditer(r'-\s+([a-z0-9-]+\.c)\s+<->\s+([a-z0-9-]+\.c)',
                         open(path).read()):
        allowed.add((m.group(1), m.group(2)))
        allowed.add((m.group(2), m.group(1)))
    return allowed


def owners(path):
    """Sub-structs of struct qcow2_image owned by one file: the member
    lines "struct image_X name;  /* file.c */"."""
    own = {}
    for m in re.finditer(r'struct image_\w+ (\w+);\s*/\* ([a-z0-9-]+\.c) \*/',
                         open(path).read()):
        own[m.group(1)] = m.group(2)
    return own


def symbols(archive):
    """For each member of the archive (named after its source file), the
    functions it defines and the symbols it references."""
    out = subprocess.run(['nm', '-A', archive], check=True,
                         capture_output=True, text=True).stdout
    defined, used = {}, {}
    for line in out.splitlines():
        # archive:member:[address] type name
        m = re.match(r'^[^:]*:([^:]+):\s*(?:[0-9a-f]+)?\s+([A-Za-z])\s+(\S+)$',
                     line)
        if not m:
            continue
        member, kind, name = m.groups()
        src = re.sub(r'^libqcow2_la-', '', member)
        src = re.sub(r'\.o$', '.c', src)
        if kind == 'T':
            defined.setdefault(name, src)
        elif kind == 'U':
            used.setdefault(src, set()).add(name)
    return defined, used


# An assignment, compound assignment, increment or decrement of
# X->name.field (or X.name.field), perhaps indexed.
WRITE = r'(?:->|\.)(%s)\.\w+(?:\[[^]]*\])?\s*(?:[-+*/|&^]?=(?!=)|\+\+|--)'
PRE = r'(?:\+\+|--)\s*\w+(?:->|\.)(%s)\.'


def main():
    readme, internal_h, archive = sys.argv[1:4]
    sources = sys.argv[4:]
    errors = 0

    order = readme_order(readme)
    rank = {f: i for i, f in enumerate(order)}
    allowed = circles(internal_h)
    defined, used = symbols(archive)

    for f in sorted(set(defined.values()) | set(used)):
        if f not in rank:
            print(f'{f}: an engine file the README does not list')
            errors += 1
    for src in sorted(used):
        for name in sorted(used[src]):
            dst = defined.get(name)
            if not dst or dst == src or src not in rank or dst not in rank:
                continue
            if rank[dst] > rank[src] and (src, dst) not in allowed:
                print(f'{src} -> {dst}: {src} uses {name}, but {dst} comes '
                      f'after it in common/qcow2/README (an upward call)')
                errors += 1

    own = owners(internal_h)
    if not own:
        print(f'{internal_h}: no owned parts of struct qcow2_image found')
        errors += 1
    parts = '|'.join(own)
    write = re.compile(WRITE % parts)
    pre = re.compile(PRE % parts)
    for path in sources:
        f = path.rsplit('/', 1)[-1]
        for n, line in enumerate(open(path), 1):
            for m in list(write.finditer(line)) + list(pre.finditer(line)):
                part = m.group(1)
                if f not in (own[part], 'image.c'):
                    print(f'{f}:{n}: writes {part}, which {own[part]} owns: '
                          f'{line.strip()}')
                    errors += 1

    edges = {(s, defined[n]) for s in used for n in used[s]
             if defined.get(n) not in (None, s)}
    print(f'{len(order)} files, {len(edges)} edges between them, '
          f'{len(own)} owned parts: {errors} violations')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
