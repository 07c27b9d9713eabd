#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The tables of a bench/run.sh run, in Markdown; the chart of every
bench's ratios against its peers.

  report.py OUTDIR                    print them
  report.py --update RESULTS OUTDIR   put the summary between the markers
                                      of the section on qemu-nbd in
                                      RESULTS, and the whole report in
                                      history/bench-run-latest.md beside
                                      it; the run's ratios into the chart
  report.py --ratios BENCH            the ratios of BENCH (on stdin, one
                                      "CASE<TAB>PEER<TAB>OURS/PEER<TAB>
                                      higher|lower" a line: which of ours
                                      is better) in place of its rows in
                                      ratios.tsv, and the chart redrawn
  report.py --chart                   the chart redrawn from ratios.tsv

The chart, ratios.svg beside RESULTS.md (shown at its top), is written
here as plain SVG: one row a case, grouped by bench, a bar a peer
from 1 to how many times better ours is (its log scale from 1/4 to 64;
below 1, the peer is better).  ratios.tsv keeps every bench's rows,
each replaced when that bench runs again.
"""
import html
import math
import os
import collections
import statistics
import sys

# bench/run.sh's rows in the chart: ours against the faster of
# qemu-nbd's modes, and with cache=none against qemu-nbd's.
RUN_BENCH = "against qemu-nbd (bench/run.sh)"
RUN_PEERS = ["qemu-nbd (its faster mode)", "qemu-nbd cache=none (ours too)"]
HERE = os.path.dirname(os.path.abspath(__file__))
RATIOS = os.path.join(HERE, "ratios.tsv")
CHART = os.path.join(HERE, "ratios.svg")

SECTION = "## Against qemu-nbd"
DETAILS = "history/bench-run-latest.md"
BEGIN = "<!-- begin bench/run.sh output -->"
END = "<!-- end bench/run.sh output -->"
SERVERS = ["ours", "ours-none", "ours-whole", "ours-whole-none", "qemu-wb",
           "qemu-none", "raw"]
LAYOUTS = ["reverse", "random", "partly-random"]


def read_tsv(path):
    try:
        with open(path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except FileNotFoundError:
        return []


def fmt(v, bw):
    if v is None:
        return "–"
    if bw:
        return "%.0f MiB/s" % v
    return "%.1fk" % (v / 1000)


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ratio(r, goal=None):
    if r is None:
        return "–"
    s = "%.2f" % r
    return "**%s**" % s if goal is not None and r < goal else s


def summary(text):
    """The report without the case definitions, the L2 and fragmented
    layouts' tables, the host syncs and memory tables and every run's
    figures, which the details file keeps (the goals they miss are
    named in the summary)."""
    out, skip = [], False
    for line in text.split("\n"):
        if line.startswith(("L2 cache entries", "Fragmented layouts",
                            "Host syncs", "Peak resident memory",
                            "<details>")):
            skip = True
        elif skip and (line.startswith("Goals missed") or line == "</details>"):
            skip = False
            if line == "</details>":
                continue
        if skip or line.startswith("- `"):
            continue
        out.append(line)
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return (text.rstrip("\n") + "\n\nCase definitions, L2 slices against "
            "whole tables, fragmented layouts, host syncs, peak memory and "
            "every run: [%s](%s).\n" % (DETAILS, DETAILS))


def read_ratios():
    rows = []
    for r in read_tsv(RATIOS):
        if r[0].startswith("#"):
            continue
        bench, case, peer, value, better = r[:5]
        rows.append((bench, case, peer, float(value), better))
    return rows


def write_ratios(bench, rows):
    """rows (case, peer, ours/peer, better) in place of bench's rows."""
    kept = [r for r in read_ratios() if r[0] != bench]
    new = [(bench, c, p, float(v), b) for c, p, v, b in rows]
    order = []
    for r in kept + new:
        if r[0] not in order:
            order.append(r[0])
    with open(RATIOS, "w") as f:
        f.write("# SPDX-License-Identifier: BSD-3-Clause\n"
                "# bench\tcase\tpeer\tours/peer\tbetter (written by "
                "bench/report.py, drawn as ratios.svg)\n")
        for b in order:
            for r in kept + new:
                if r[0] == b:
                    f.write("%s\t%s\t%s\t%.3f\t%s\n" % r)
    chart()


# One colour a peer (12, distinct); past them, hues spread around the
# wheel, so that no two peers share one.
PEER_COLOURS = ["#1f77b4", "#9ecae1", "#ff7f0e", "#2ca02c", "#9467bd",
                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                "#d62728", "#ffbb78"]


def peer_colour(i):
    if i < len(PEER_COLOURS):
        return PEER_COLOURS[i]
    return "hsl(%d,65%%,40%%)" % ((i * 137.5) % 360)


def chart():
    """ratios.svg: how many times better than each peer ours is."""
    rows = read_ratios()
    peers = []
    for r in rows:
        if r[2] not in peers:
            peers.append(r[2])
    colour = {p: peer_colour(i) for i, p in enumerate(peers)}
    # One line a (bench, case), its bars one a peer.
    lines = collections.OrderedDict()
    for bench, case, peer, value, better in rows:
        adv = value if better == "higher" else 1 / value
        lines.setdefault((bench, case), []).append((peer, adv, value))
    lo, hi = 0.25, 64.0
    left, width, bar, gap = 330, 420, 9, 6
    total = left + width + 50
    legend = []
    lx, ly = 4, 30
    for p in peers:
        if lx + 20 + 7 * len(p) > total:
            lx, ly = 4, ly + 16
        legend.append('<rect x="%d" y="%d" width="10" height="10" '
                      'fill="%s"/><text x="%d" y="%d" font-size="11">%s'
                      '</text>' % (lx, ly, colour[p], lx + 14, ly + 9,
                                   html.escape(p)))
        lx += 20 + 7 * len(p)
    top = ly + 26
    x = (lambda v: left + width * (math.log(min(max(v, lo), hi) / lo)
                                   / math.log(hi / lo)))
    out = []
    y = top
    bench_seen = None
    for (bench, case), bars in lines.items():
        if bench != bench_seen:
            y += 8
            out.append('<text x="4" y="%d" font-weight="bold">%s</text>'
                       % (y + 10, html.escape(bench)))
            y += 16
            bench_seen = bench
        h = len(bars) * bar
        out.append('<text x="%d" y="%d" text-anchor="end">%s</text>'
                   % (left - 6, y + h / 2 + 4, html.escape(case)))
        for i, (peer, adv, value) in enumerate(bars):
            x0, x1 = sorted((x(1), x(adv)))
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" '
                       'fill="%s"><title>%s, against %s: ours/peer %.3f'
                       '</title></rect>'
                       % (x0, y + i * bar, max(x1 - x0, 1), bar - 1,
                          colour[peer], html.escape(case), html.escape(peer),
                          value))
            out.append('<text x="%.1f" y="%d" font-size="9">%.2f</text>'
                       % (x(adv) + (3 if adv >= 1 else -26),
                          y + i * bar + bar - 2, adv))
        y += h + gap
    height = y + 40
    grid = []
    for v in (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64):
        grid.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>'
                    % (x(v), top, x(v), y, "#000" if v == 1 else "#ddd"))
        grid.append('<text x="%.1f" y="%d" text-anchor="middle" '
                    'font-size="10">%s</text>'
                    % (x(v), y + 14, ("%g" % v) + ("x" if v >= 1 else "")))
    svg = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<!-- SPDX-License-Identifier: BSD-3-Clause -->',
           '<!-- Written by bench/report.py from bench/ratios.tsv. -->',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">'
           % (total, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="4" y="16" font-size="13">How many times better than '
           'each peer ours is, in the same run (right of 1: ours better; '
           'log scale)</text>']
    svg += legend + grid + out
    svg.append('<text x="%d" y="%d" font-size="10">throughput: ours/peer; '
               'time, CPU and size: peer/ours.  Figures and commands: '
               'RESULTS.md.</text>' % (4, y + 32))
    svg.append("</svg>")
    with open(CHART, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    args = sys.argv[1:]
    if args and args[0] == "--chart":
        chart()
        return
    if args and args[0] == "--ratios":
        write_ratios(args[1], [line.rstrip("\n").split("\t")
                               for line in sys.stdin if line.strip()])
        return
    update = None
    if args and args[0] == "--update":
        update = args[1]
        args = args[2:]
    out = args[0]

    meta = dict(line.split("=", 1) for line in
                open(out + "/meta.txt").read().splitlines() if "=" in line)
    runs = collections.defaultdict(list)
    rss = collections.defaultdict(list)
    cases = []
    for name, server, _round, value, peak, _syncs in read_tsv(out + "/runs.tsv"):
        if name not in cases:
            cases.append(name)
        runs[name, server].append(float(value))
        rss[name, server].append(int(peak))
    commands = {(n, s): (srv, fio) for n, s, srv, fio in
                read_tsv(out + "/commands.txt")}
    syncs = {(n, s): (int(k), int(c), int(f)) for n, s, k, c, f in
             read_tsv(out + "/syncs.tsv")}
    descs = dict(read_tsv(out + "/cases.tsv"))
    goals = {}
    for n, g in read_tsv(out + "/goals.tsv"):
        goals[n] = dict(item.split(">=") for item in g.split() if ">=" in item)
        for item in g.split():
            if item.startswith("syncs+"):
                goals[n]["syncs"] = int(item[6:])

    def short(cmd):
        for key in ("plugin", "out", "img"):
            cmd = cmd.replace(meta[key], "$" + key.upper())
        return cmd

    def med(name, server):
        v = runs.get((name, server))
        return statistics.median(v) if v else None

    lines = []
    w = lines.append
    w("Run of %s in %s mode (%s rounds, %s s per timed run after %s s of "
      "ramp), tree at `%s`." % (meta["date"], meta["mode"], meta["reps"],
                                meta["runtime"], meta["ramp"], meta["commit"]))
    w("Machine: %s, %s, Linux %s, images on %s; load average %s at the "
      "start, %s at the end." % (meta["cpu"], meta["memory"], meta["kernel"],
                                 meta["filesystem"], meta["load_start"],
                                 meta.get("load_end", "?")))
    w("Versions: %s, %s, %s." % (meta["fio"], meta["qemu-nbd"], meta["nbdkit"]))
    w("")
    w("Medians of the rounds.  IOPS in thousands, or MiB/s.  *ours* is "
      "the plugin with the page cache (the default), *ours none* with "
      "cache=none (O_DIRECT).  Each goal against qemu-nbd is checked "
      "twice: ours against the faster of qemu-nbd's two modes, and ours "
      "none against qemu-nbd none; a ratio below its goal is in bold.")
    w("")
    w("| case | ours | ours none | qemu-nbd wb | qemu-nbd none | raw | "
      "ours/best qemu | ours none/qemu none | ours/raw | goals | met |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- "
      "| --- |")
    missed = []
    for name in cases:
        bw = name.startswith("seq-")
        m = {s: med(name, s) for s in SERVERS}
        g = goals.get(name, {})
        qbest = max([v for v in (m["qemu-none"], m["qemu-wb"]) if v] or [0])
        checks = []
        if "qemu" in g:
            checks.append(("ours/qemu ≥ %s" % g["qemu"],
                           ratio(m["ours"], qbest), float(g["qemu"])))
            checks.append(("none/qemu none ≥ %s" % g["qemu"],
                           ratio(m["ours-none"], m["qemu-none"]),
                           float(g["qemu"])))
        if "raw" in g:
            checks.append(("ours/raw ≥ %s" % g["raw"],
                           ratio(m["ours"], m["raw"]), float(g["raw"])))
        if "whole" in g:
            checks.append(("ours/whole ≥ %s" % g["whole"],
                           ratio(m["ours"], m["ours-whole"]),
                           float(g["whole"])))
            checks.append(("none/whole none ≥ %s" % g["whole"],
                           ratio(m["ours-none"], m["ours-whole-none"]),
                           float(g["whole"])))
        if "syncs" in g:
            extra = g["syncs"]
            # With cache=none the file grows by the writes, as in QEMU:
            # a flush after allocating writes syncs before the L2
            # entries and after them (see io.h, grows_by_writes).
            for s, per in (("ours", 1), ("ours-none", 2)):
                if (name, s) in syncs:
                    k, _, f = syncs[name, s]
                    checks.append(("%s: %d sync%s per flush%s" % (
                        s, per, "s" if per > 1 else "",
                        " (+%d once)" % extra if extra else ""),
                        (per * f + extra) / k if k else None, 1.0))
        ok = all(r is not None and r >= goal for _, r, goal in checks)
        if not ok:
            missed.append(name)
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name,
            *(fmt(m[s], bw) for s in ("ours", "ours-none", "qemu-wb",
                                      "qemu-none", "raw")),
            fmt_ratio(ratio(m["ours"], qbest),
                      float(g["qemu"]) if "qemu" in g else None),
            fmt_ratio(ratio(m["ours-none"], m["qemu-none"]),
                      float(g["qemu"]) if "qemu" in g else None),
            fmt_ratio(ratio(m["ours"], m["raw"]),
                      float(g["raw"]) if "raw" in g else None),
            "; ".join(c if r is None or r >= goal else "**%s**" % c
                      for c, r, goal in checks),
            "yes" if ok else "**no**"))
    w("")
    for name in cases:
        if name in descs:
            w("- `%s`: %s" % (name, descs[name]))
    w("")

    l2 = [n for n in cases if "whole" in goals.get(n, {})]
    if l2:
        w("L2 cache entries: slices (the default here, 4 KiB) against whole "
          "tables (l2-slice-size = the cluster size), the same cache size:")
        w("")
        w("| case | ours | whole | ours/whole | ours none | whole none | "
          "none/whole none |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in l2:
            goal = float(goals[name]["whole"])
            w("| %s | %s | %s | %s | %s | %s | %s |" % (
                name, fmt(med(name, "ours"), False),
                fmt(med(name, "ours-whole"), False),
                fmt_ratio(ratio(med(name, "ours"), med(name, "ours-whole")),
                          goal),
                fmt(med(name, "ours-none"), False),
                fmt(med(name, "ours-whole-none"), False),
                fmt_ratio(ratio(med(name, "ours-none"),
                                med(name, "ours-whole-none")), goal)))
        w("")

    # Workload 2: the time of the fragmented layouts against sequential.
    frag = [(rw, lay) for rw in ("read", "write") for lay in LAYOUTS
            if "seq-%s-%s" % (rw, lay) in cases
            and "seq-%s-sequential" % rw in cases]
    if frag:
        w("Fragmented layouts: time of a sequential pass over the image, "
          "relative to the image written in order (goal for ours, in both "
          "modes: at most 1.25).")
        w("")
        w("| pass, layout | ours | ours none | qemu-nbd wb | qemu-nbd none "
          "| raw file |")
        w("| --- | ---: | ---: | ---: | ---: | ---: |")
        for rw, lay in frag:
            cells = []
            for s in ("ours", "ours-none", "qemu-wb", "qemu-none", "raw"):
                r = ratio(med("seq-%s-sequential" % rw, s),
                          med("seq-%s-%s" % (rw, lay), s))
                if s.startswith("ours") and (r is None or r > 1.25):
                    missed.append("seq-%s-%s (%s time)" % (rw, lay, s))
                    cells.append("**%.2f**" % r if r else "–")
                else:
                    cells.append("%.2f" % r if r else "–")
            w("| %s, %s | %s |" % (rw, lay, " | ".join(cells)))
        w("")

    if syncs:
        w("Host syncs (fdatasync, fsync, sync_file_range, counted with "
          "`strace -f` in one more run) while the client ran, and after "
          "the server was told to stop (closing the image):")
        w("")
        w("| case | server | syncs, running | client flushes | per flush | "
          "syncs, closing |")
        w("| --- | --- | ---: | ---: | ---: | ---: |")
        for (n, s), (k, c, f) in syncs.items():
            w("| %s | %s | %d | %d | %s | %d |" % (
                n, s, k, f, "%.2f" % (k / f) if f else "–", c))
        w("")

    w("Peak resident memory of the server (VmHWM, MiB, median):")
    w("")
    w("| case | " + " | ".join(SERVERS) + " |")
    w("| --- |" + " ---: |" * len(SERVERS))
    for name in cases:
        cells = []
        for s in SERVERS:
            v = rss.get((name, s))
            cells.append("%.1f" % (statistics.median(v) / 1024) if v else "–")
        w("| %s | %s |" % (name, " | ".join(cells)))
    w("")

    variants = [v.split(":", 1) for v in meta.get("variants", "").split()]
    if variants:
        w("Variants of our plugin (ours with more options), and ours over "
          "each:")
        w("")
        w("| case | ours | " + " | ".join(
            "%s (%s) | ours/%s" % (n, o, n) for n, o in variants) + " |")
        w("| --- | ---: |" + " ---: | ---: |" * len(variants))
        for name in cases:
            bw = name.startswith("seq-")
            cells = [fmt(med(name, "ours"), bw)]
            for n, _ in variants:
                cells += [fmt(med(name, n), bw),
                          fmt_ratio(ratio(med(name, "ours"), med(name, n)))]
            w("| %s | %s |" % (name, " | ".join(cells)))
        w("")
        if frag:
            w("| pass, layout | ours | " + " | ".join(
                n for n, _ in variants) + " |")
            w("| --- | ---: |" + " ---: |" * len(variants))
            for rw, lay in frag:
                cells = []
                for s in ["ours"] + [n for n, _ in variants]:
                    r = ratio(med("seq-%s-sequential" % rw, s),
                              med("seq-%s-%s" % (rw, lay), s))
                    cells.append("%.2f" % r if r else "–")
                w("| %s, %s | %s |" % (rw, lay, " | ".join(cells)))
            w("")

    w("Goals missed in this run: %s." %
      (", ".join("`%s`" % n for n in missed) if missed else "none"))
    w("")
    w("<details><summary>Every run, and the exact commands</summary>")
    w("")
    w("| case | server | runs |")
    w("| --- | --- | --- |")
    for name in cases:
        for s in SERVERS + [n for n, _ in variants]:
            if (name, s) in runs:
                w("| %s | %s | %s |" % (name, s, ", ".join(
                    fmt(v, name.startswith("seq-")) for v in runs[name, s])))
    w("")
    w("With IMG=%s (the images), OUT=%s (this run's files) and "
      "PLUGIN=%s:" % (meta["img"], meta["out"], meta["plugin"]))
    w("")
    w("```")
    last = None
    for (n, s), (srv, fio) in commands.items():
        if n != last:
            w("# %s" % n)
            w(short(fio))
            last = n
        w(short(srv))
    w("```")
    w("")
    w("</details>")
    text = "\n".join(lines) + "\n"

    if update is None:
        sys.stdout.write(text)
        return
    details = os.path.join(os.path.dirname(update), DETAILS)
    with open(details, "w") as f:
        f.write("<!-- SPDX-License-Identifier: BSD-3-Clause -->\n"
                "# The last bench/run.sh run, whole\n\n" + text)
    text = summary(text)
    doc = open(update).read()
    block = "%s\n\n%s\n%s\n" % (BEGIN, text, END)
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        doc = head + block + ("\n" + tail if tail else "")
    elif SECTION in doc:
        head, rest = doc.split(SECTION, 1)
        doc = head + SECTION + "\n\n" + block + rest
    else:
        doc = doc.rstrip("\n") + "\n\n" + SECTION + "\n\n" + block
    with open(update, "w") as f:
        f.write(doc)
    ratios = []
    for name in cases:
        best = max([v for v in (med(name, "qemu-none"), med(name, "qemu-wb"))
                    if v] or [0])
        for peer, r in ((RUN_PEERS[0], ratio(med(name, "ours"), best)),
                        (RUN_PEERS[1], ratio(med(name, "ours-none"),
                                             med(name, "qemu-none")))):
            if r:
                ratios.append((name, peer, r, "higher"))
    write_ratios(RUN_BENCH, ratios)


if __name__ == "__main__":
    main()
