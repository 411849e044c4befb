#!/usr/bin/env python3
"""Distinct code a request runs through: the 64-byte lines and 4 KB pages of machine code
executed at least once per request on average, per program or library, from two callgrind runs
made with --dump-instr=yes (N requests and none; benches/instructions.sh with CODE_LINES=1).
With caches cold (a low request rate on a busy machine) each such line is fetched anew, so this
is what a request costs beyond its instructions.
Usage: code_lines.py ZERO.out MANY.out N
"""
import re
import sys
from collections import Counter

OBJECT = re.compile(r"c?ob=\((\d+)\)\s*(.*)")


def executed(path):
    """Instructions executed per (object, address) in one callgrind output."""
    cost = Counter()
    names, obj, last, inclusive = {}, None, [0, 0], False

    def position(token, i):
        base = 16 if i == 0 else 10
        if token.startswith("0x"):
            last[i] = int(token, 16)
        elif token[0] == "+":
            last[i] += int(token[1:], base)
        elif token[0] == "-":
            last[i] -= int(token[1:], base)
        elif token != "*":
            last[i] = int(token)
        return last[i]

    with open(path, errors="replace") as f:
        for line in f:
            m = OBJECT.match(line)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2).strip()
                if line.startswith("ob="):
                    obj = names.get(m.group(1))
                continue
            if line.startswith("calls="):
                inclusive = True  # the next cost line is the call's inclusive cost
                continue
            if not line[:1].isdigit() and line[:1] not in ("+", "-", "*"):
                continue
            parts = line.split()
            if len(parts) < 3:
                continue
            address = position(parts[0], 0)
            position(parts[1], 1)
            if inclusive:
                inclusive = False
                continue
            cost[(obj, address)] += int(parts[2])
    return cost


def main(zero, many, n):
    a, b = executed(zero), executed(many)
    lines, pages = Counter(), Counter()
    per_line, per_page = Counter(), Counter()
    for (obj, address) in set(a) | set(b):
        extra = b[(obj, address)] - a[(obj, address)]
        if extra > 0:
            per_line[(obj, address >> 6)] += extra
            per_page[(obj, address >> 12)] += extra
    for (obj, _), c in per_line.items():
        if c >= n:
            lines[obj] += 1
    for (obj, _), c in per_page.items():
        if c >= n:
            pages[obj] += 1
    for obj, c in lines.most_common():
        print(f"{c:6} code lines, {pages[obj]:4} pages per request: {obj}")
    print(f"{sum(lines.values()):6} code lines, {sum(pages.values()):4} pages per request in all")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
