#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Instructions spent in the plugin and in the overlap guard, from a
# callgrind output file.
#
# callgrind_annotate keys functions by source file, so one function with
# inlined code shows up under several names and its inclusive figures
# cannot simply be added up.  Reading the file directly gives exact
# sums:
#
#   plugin:  self cost of every function of the plugin object, plus the
#            calls it makes into other objects (libc memcpy, pwrite, ...)
#   check:   overlap_check with everything it calls
#   maint:   the other overlap_* functions (add, set, expand, build, ...)
#            with everything they call outside the overlap_* group
#
# Usage: callgrind-share.py CALLGRIND.OUT PLUGIN.so [TOP]
#        callgrind-share.py --per-call CALLGRIND.OUT FUNCTION...
#
# Prints one line of "name value" pairs, then with TOP the TOP functions
# of the plugin by self cost and the cost of each overlap_* function.
# With --per-call: calls and inclusive instructions of each FUNCTION.

import re
import sys
from collections import defaultdict

CHECK = "overlap_check"


def is_overlap(name):
    return name.startswith("overlap_")


def parse(path):
    names = {"ob": {}, "fl": {}, "fn": {}}
    kind = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl",
            "cfi": "fl", "cfl": "fl", "fn": "fn", "cfn": "fn"}
    compressed = re.compile(r"\((\d+)\)(?: (.*))?$")

    def name_of(key, value):
        m = compressed.match(value)
        if not m:
            return value
        table = names[kind[key]]
        if m.group(2) is not None:
            table[m.group(1)] = m.group(2)
        return table[m.group(1)]

    self_cost = defaultdict(int)          # (ob, fn) -> Ir
    call_cost = defaultdict(int)          # ((ob, fn), (cob, cfn)) -> Ir
    call_count = defaultdict(int)         # ((ob, fn), (cob, cfn)) -> calls
    ob = fn = cob = cfn = None
    in_call = False
    summary = 0

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                fields = line.split()
                ir = int(fields[1]) if len(fields) > 1 else 0
                if in_call:
                    call_cost[((ob, fn), (cob, cfn))] += ir
                    in_call = False
                    cob = None
                else:
                    self_cost[(ob, fn)] += ir
                continue
            key, _, value = line.partition("=")
            if key == "ob":
                ob = name_of(key, value)
            elif key == "fn":
                fn = name_of(key, value)
                cob = None
            elif key == "cob":
                cob = name_of(key, value)
            elif key == "cfn":
                cfn = name_of(key, value)
            elif key in ("fl", "fi", "fe", "cfi", "cfl"):
                name_of(key, value)
            elif key == "calls":
                # A call's object is the caller's unless cob= said
                # otherwise just before it.
                if cob is None:
                    cob = ob
                call_count[((ob, fn), (cob, cfn))] += int(value.split()[0])
                in_call = True
            elif line.startswith("summary:"):
                summary = int(line.split()[1])
    return summary, self_cost, call_cost, call_count


def per_call(path, functions):
    summary, self_cost, call_cost, call_count = parse(path)
    for name in functions:
        incl = sum(v for (ob, fn), v in self_cost.items() if fn == name)
        incl += sum(v for ((ob, fn), (cob, cfn)), v in call_cost.items()
                    if fn == name and cfn != name)
        n = sum(v for (_, (cob, cfn)), v in call_count.items()
                if cfn == name)
        print("%s calls %d Ir %d Ir/call %.1f"
              % (name, n, incl, incl / n if n else 0))


def main():
    if sys.argv[1] == "--per-call":
        per_call(sys.argv[2], sys.argv[3:])
        return
    path, plugin = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    summary, self_cost, call_cost, call_count = parse(path)

    def in_plugin(ob):
        return ob is not None and ob.endswith(plugin.split("/")[-1])

    plugin_self = sum(v for (ob, fn), v in self_cost.items()
                      if in_plugin(ob))
    plugin_out = sum(v for ((ob, fn), (cob, cfn)), v in call_cost.items()
                     if in_plugin(ob) and not in_plugin(cob))
    plugin_total = plugin_self + plugin_out

    def group(pred):
        """Self cost of the functions in pred, plus their calls to
        functions outside it."""
        s = sum(v for (ob, fn), v in self_cost.items()
                if in_plugin(ob) and pred(fn))
        s += sum(v for ((ob, fn), (cob, cfn)), v in call_cost.items()
                 if in_plugin(ob) and pred(fn)
                 and not (in_plugin(cob) and pred(cfn)))
        return s

    check = group(lambda n: n == CHECK)
    guard = group(is_overlap)
    checks = sum(v for (_, (cob, cfn)), v in call_count.items()
                 if in_plugin(cob) and cfn == CHECK)
    print("program %d plugin %d plugin_self %d check %d maint %d calls %d"
          % (summary, plugin_total, plugin_self, check, guard - check,
             checks))
    if top:
        by_fn = defaultdict(int)
        for (ob, fn), v in self_cost.items():
            if in_plugin(ob):
                by_fn[fn] += v
        print("\n| function | self Ir | share of plugin |")
        print("| --- | ---: | ---: |")
        for fn, v in sorted(by_fn.items(), key=lambda kv: -kv[1])[:top]:
            print("| %s | %d | %.2f%% |" % (fn, v, 100.0 * v / plugin_total))
        print("\n| guard function | calls | inclusive Ir | Ir/call |")
        print("| --- | ---: | ---: | ---: |")
        guard_fns = sorted({fn for (ob, fn) in self_cost
                            if in_plugin(ob) and is_overlap(fn)})
        rows = []
        for name in guard_fns:
            n = sum(v for (_, (cob, cfn)), v in call_count.items()
                    if in_plugin(cob) and cfn == name)
            rows.append((group(lambda f, name=name: f == name), n, name))
        for incl, n, name in sorted(rows, reverse=True):
            print("| %s | %d | %d | %.1f |" % (name, n, incl,
                                              incl / n if n else 0))


if __name__ == "__main__":
    main()
