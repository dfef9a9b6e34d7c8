#!/usr/bin/env python3
"""Joins the outputs of scripts/bench_collectives.sh into one markdown table per op.

Usage: bench_collectives_table.py DIR   (DIR holds cohort_gloo.N.txt, cohort_mpi.N.txt, mpi.N.txt,
gloo.N.txt as the programs printed them, N = 1.. for repeated runs; a row keeps its fastest run). For each size: time (µs) and busbw (GB/s) of every
program, the memcpy limit, and the ratios the goals are about: cohort mpi time / bare MPI time,
and cohort gloo busbw / bare gloo busbw (time ratio at small sizes). Wrong results are flagged.
"""
import glob
import os
import sys


def load(prefix):
    rows = {}
    paths = sorted(glob.glob(prefix + ".*.txt")) + ([prefix + ".txt"] if os.path.exists(prefix + ".txt") else [])
    for path in paths:
        load_one(path, rows)
    return rows


def load_one(path, rows):
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split()
            if len(parts) != 8:
                continue
            op, size, _count, _type, t, _alg, bus, wrong = parts
            key, row = (op, int(size)), (float(t), float(bus), int(wrong))
            if op == "memcpy":
                row = (float(t), float(bus), 0)
            old = rows.get(key)
            # The fastest run wins; a wrong result in any run is kept.
            if old is None or row[0] < old[0]:
                rows[key] = (row[0], row[1], row[2] + (old[2] if old else 0))
            elif row[2]:
                rows[key] = (old[0], old[1], old[2] + row[2])


def main():
    d = sys.argv[1]
    progs = [("cohort gloo", load(os.path.join(d, "cohort_gloo"))),
             ("gloo", load(os.path.join(d, "gloo"))),
             ("cohort mpi", load(os.path.join(d, "cohort_mpi"))),
             ("MPI", load(os.path.join(d, "mpi")))]
    shm = load(os.path.join(d, "cohort_shm"))
    if shm:
        progs.append(("cohort shm", shm))
    memcpy = {size: bus for (op, size), (_t, bus, _w) in progs[0][1].items() if op == "memcpy"}
    ops = []
    for _name, rows in progs:
        for (op, _size) in rows:
            if op != "memcpy" and op not in ops:
                ops.append(op)
    bad = 0
    for op in ops:
        sizes = sorted({s for _n, rows in progs for (o, s) in rows if o == op})
        print(f"\n### {op}\n")
        print("| size | " + " | ".join(f"{n} µs (busbw)" for n, _ in progs) +
              " | memcpy GB/s | cohort mpi / MPI time | cohort gloo / gloo time |")
        print("|---" * (len(progs) + 4) + "|")
        for s in sizes:
            cells = []
            for _n, rows in progs:
                r = rows.get((op, s))
                if r is None:
                    cells.append("–")
                    continue
                t, bus, wrong = r
                bad += wrong
                cells.append(f"{t:.2f} ({bus:.3f})" + (f" **{wrong} wrong**" if wrong else ""))

            def ratio(a, b):
                ra, rb = progs[a][1].get((op, s)), progs[b][1].get((op, s))
                return f"{ra[0] / rb[0]:.2f}×" if ra and rb and rb[0] > 0 else "–"
            mc = min((v for k, v in memcpy.items() if k >= s), default=None) if memcpy else None
            mc = memcpy.get(s, mc)
            label = f"{s // (1 << 20)} MiB" if s >= 1 << 20 and s % (1 << 20) == 0 else (
                f"{s // 1024} KiB" if s >= 1024 and s % 1024 == 0 else f"{s} B")
            print(f"| {label} | " + " | ".join(cells) + f" | {mc:.2f} |" if mc else f"| {label} | " + " | ".join(cells) + " | – |",
                  end="")
            print(f" {ratio(2, 3)} | {ratio(0, 1)} |")
    if bad:
        print(f"\n{bad} wrong elements in total", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
