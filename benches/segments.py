#!/usr/bin/env python3
"""Reads the callgrind dumps benches/segments.sh made (one before each recv and send of the
gateway's event loop) and prints the median instructions of each stretch of a keep-alive
request: request side, waiting, reply side, after the answer. With --lines (the dumps made
with --dump-instr=yes), also the distinct 64-byte code lines each stretch runs through: at a low
request rate, what each stretch fetches anew.

usage: segments.py DIR FIRST N [--lines]   (FIRST: dumps made before the counted requests)
"""
import re
import statistics
import sys
from pathlib import Path

from code_lines import executed


def dumps(directory: Path):
    """(index, trigger, instructions) of every numbered dump, in order."""
    out = []
    for f in directory.glob("cg.out.*"):
        m = re.fullmatch(r"cg\.out\.(\d+)(?:-\d+)?", f.name)
        if not m:
            continue
        trigger, total = "", None
        with f.open(errors="replace") as fh:
            for line in fh:
                if line.startswith("desc: Trigger:"):
                    trigger = line.split("--dump-before=")[-1].strip()
                elif line.startswith(("totals:", "summary:")):
                    total = int(line.split()[1])
        if total is not None:
            out.append((int(m.group(1)), trigger, total))
    return sorted(out)


def main():
    directory, first, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with_lines = "--lines" in sys.argv[4:]
    rows = [d for d in dumps(directory) if d[0] > first]
    # The first counted dump ends at the first request's read (it holds the idle time before it);
    # then every request is send (upstream), recv (answer), send (client), recv (next request).
    names = ["request: client read -> upstream write", "waiting: upstream write -> answer read",
             "reply: answer read -> client write", "after: client write -> next read"]
    # A write is `send` (the gateway) or `writev` (nginx).
    want = ["write", "recv", "write", "recv"]
    stretches = {name: [] for name in names}
    lines = {name: [] for name in names}
    i = 1
    while i + 3 < len(rows):
        group = rows[i:i + 4]
        if [("write" if g[1] in ("send", "writev") else g[1]) for g in group] != want:
            # The end of the run: the client's close, the shutdown.
            break
        for name, g in zip(names, group):
            stretches[name].append(g[2])
            if with_lines:
                ran = executed(directory / f"cg.out.{g[0]}")
                lines[name].append(len({(obj, address >> 6) for obj, address in ran}))
        i += 4
    counted = len(stretches[names[0]])
    if counted < n - 1:
        print(f"only {counted} of {n} requests were seen in the expected order of socket "
              "calls (write, recv, write, recv)", file=sys.stderr)
        sys.exit(1)
    print(f"{counted} requests, median instructions per stretch (min-max):")
    for name in names:
        v = stretches[name]
        print(f"  {name:42} {statistics.median(v):8.0f}  ({min(v)}-{max(v)})")
    print(f"  {'sum of the medians':42} {sum(statistics.median(v) for v in stretches.values()):8.0f}")
    if with_lines:
        print("median distinct code lines per stretch (min-max):")
        for name in names:
            v = lines[name]
            print(f"  {name:42} {statistics.median(v):8.0f}  ({min(v)}-{max(v)})")


if __name__ == "__main__":
    main()
