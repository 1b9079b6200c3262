#!/usr/bin/env python3
"""Where a kernel's warp samples fall, from Nsight Compute's per-instruction page.

    scripts/ncu_source_regions.py SOURCE.csv [--min PERCENT] [--top N]

SOURCE.csv is what

    ncu --section SourceCounters --page source --print-source sass --csv \\
        --kernel-name regex:NAME --launch-skip 3 --launch-count 1 COMMAND > SOURCE.csv

prints for one launch (flexjit's own lines before the CSV are skipped). Instructions are grouped
two ways, each group's share of all warp samples ("Warp Stall Sampling (All Samples)") printed:

- by how often the instruction ran ("Instructions Executed", a warp-level count): a loop's body
  runs steps x warps times, a CTA's prologue and epilogue once per warp and CTA, a single
  producer thread's code once per CTA or per step, so the classes separate what a kernel pays
  per step from what it pays per CTA (docs/kernels/backward_sm90.md "The dense passes and the
  per-CTA cost" reads the sm_90a dK/dV kernel this way);
- by runs of consecutive instructions of one class (the SASS regions), with the first
  instruction of each run, and the --top single instructions with the most samples.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
    if not starts:
        sys.exit(f"{path}: no 'Address' header (not ncu --page source --csv output?)")
    header = rows[starts[0]]
    col = {name: i for i, name in enumerate(header)}
    for name in (SAMPLES, EXECUTED, "Source"):
        if name not in col:
            sys.exit(f"{path}: no '{name}' column (run ncu with --section SourceCounters)")
    data = [r for r in rows[starts[0] + 1:] if len(r) == len(header)]
    return [(r[col["Source"]].strip(), number(r[col[EXECUTED]]), number(r[col[SAMPLES]]))
            for r in data]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--min", type=float, default=0.5,
                    help="print groups and runs of at least this %% of the samples (default 0.5)")
    ap.add_argument("--top", type=int, default=10, help="single instructions to list (default 10)")
    a = ap.parse_args()
    instrs = read(a.csv)
    total = sum(s for _, _, s in instrs)
    if total == 0:
        sys.exit(f"{a.csv}: no warp samples")
    print(f"{len(instrs)} instructions, {total:.0f} warp samples")

    by_count = collections.defaultdict(lambda: [0, 0.0])
    for _, executed, samples in instrs:
        by_count[executed][0] += 1
        by_count[executed][1] += samples
    print("\nby times executed (warp-level):")
    for executed, (n, samples) in sorted(by_count.items(), key=lambda kv: -kv[1][1]):
        if 100 * samples / total >= a.min:
            print(f"  {executed:>12.0f} x  {n:5d} instructions  {100 * samples / total:5.1f} %")

    print("\nby runs of one class (first instruction shown):")
    run = None
    runs = []
    for k, (source, executed, samples) in enumerate(instrs):
        if run is not None and run[2] == executed:
            run[1] = k
            run[3] += samples
        else:
            run = [k, k, executed, samples, source]
            runs.append(run)
    for first, last, executed, samples, source in runs:
        if 100 * samples / total >= a.min:
            print(f"  [{first:5d}-{last:5d}] {executed:>12.0f} x  {100 * samples / total:5.1f} %  "
                  f"{source[:60]}")

    print(f"\nthe {a.top} instructions with the most samples:")
    ranked = sorted(enumerate(instrs), key=lambda kv: -kv[1][2])[:a.top]
    for k, (source, executed, samples) in ranked:
        print(f"  {k:5d} {executed:>12.0f} x  {100 * samples / total:5.2f} %  {source[:60]}")


if __name__ == "__main__":
    main()
