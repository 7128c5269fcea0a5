#!/usr/bin/env python3
"""Fold `perf script` output (read on stdin) into collapsed stacks, the input
format of flame graph renderers: one line per distinct stack,
"comm;outer;...;leaf COUNT". Also prints the 15 hottest leaf functions to
stderr. Used by scripts/profile.sh (`make profile`)."""
import collections
import re
import sys


def fold(lines):
    stacks = collections.Counter()
    comm, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if comm is not None and frames:
                stacks[";".join([comm] + frames[::-1])] += 1
            comm, frames = None, []
            continue
        if not line[0].isspace():        # a sample's header: "comm pid time: period event:"
            comm = line.split()[0]
            continue
        # "\t    7f12ab sym+0x1c (/path/dso)": keep the symbol without its offset
        m = re.match(r"\s*[0-9a-f]+\s+(.*?)(\+0x[0-9a-f]+)?\s+\((.*)\)$", line)
        if m:
            sym = m.group(1)
            if sym == "[unknown]":
                sym = "[" + m.group(3).rsplit("/", 1)[-1] + "]"
            frames.append(sym.replace(";", ":").replace(" ", "_"))
    if comm is not None and frames:
        stacks[";".join([comm] + frames[::-1])] += 1
    return stacks


def main():
    stacks = fold(sys.stdin)
    for s, n in sorted(stacks.items()):
        print(f"{s} {n}")
    leaves = collections.Counter()
    for s, n in stacks.items():
        leaves[s.rsplit(";", 1)[-1]] += n
    total = sum(leaves.values()) or 1
    print(f"{total} samples; hottest functions:", file=sys.stderr)
    for sym, n in leaves.most_common(15):
        print(f"  {100.0 * n / total:5.1f}%  {sym}", file=sys.stderr)
    return 0 if stacks else 1


if __name__ == "__main__":
    sys.exit(main())
