#!/usr/bin/env python3
"""The gateway's (or nginx's) own time on a request's critical path, from the kernel's
timestamps of its system calls (`perf script` output of benches/critical_path.sh):

- request: from the read that brought the client's request to the write that sends it upstream;
- reply: from the read that brought the upstream's answer to the write that sends it to the
  client (the first write of a stream);
- wake: from the event loop's wake-up to that client read, on a connection that had served a
  request before.

Everything else a client waits for (the loopback, the upstream, the scheduler) is the same for
any proxy. Each thread's calls are read in order: a read from a connection starts a request,
the next write to another connection is its upstream, a read from that one is the answer.
Usage: critical_path.py PERF_SCRIPT_TEXT
"""
import re
import sys
from collections import defaultdict

LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+syscalls:(\w+):\s*(.*)$")
FD = re.compile(r"fd: (0x[0-9a-f]+)")
RET = re.compile(r"0x[0-9a-f]+")


def calls(path):
    by_thread = defaultdict(list)
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                tid, t, name, args = m.groups()
                by_thread[tid].append((float(t) * 1e6, name, args))
    return by_thread.values()


def main(path):
    request = {True: [], False: []}
    reply, wake = [], []
    for events in calls(path):
        state, client, upstream, since = None, None, None, 0.0
        woke, fd, entered = None, None, 0.0
        seen = set()
        for t, name, args in events:
            if name == "sys_exit_epoll_wait":
                if not args.rstrip().endswith("0x0"):
                    woke = t
            elif name == "sys_enter_recvfrom":
                fd, entered = int(FD.search(args).group(1), 16), t
            elif name == "sys_exit_recvfrom":
                ret = int(RET.search(args).group(0), 16)
                if ret == 0 or ret > 0x7FFFFFFF:  # end of stream, or an error (EAGAIN)
                    continue
                if state in (None, "replied") and fd != upstream:
                    state, client, since = "read", fd, t
                    if fd in seen and woke is not None:
                        wake.append(entered - woke)
                    reused = fd in seen
                    seen.add(fd)
                elif state == "sent" and fd == upstream:
                    state, since = "answered", t
            elif name in ("sys_enter_sendto", "sys_enter_writev"):
                fd = int(FD.search(args).group(1), 16)
                if state == "read" and fd != client:
                    request[reused].append(t - since)
                    state, upstream = "sent", fd
                elif state == "answered" and fd == client:
                    reply.append(t - since)
                    state = "replied"
    rows = [
        ("request, new connection", request[False]),
        ("request, reused connection", request[True]),
        ("reply", reply),
        ("wake to read, reused", wake),
    ]
    print(f"{'µs':<28} {'n':>5} {'p25':>6} {'p50':>6} {'p75':>6} {'mean':>6}")
    for label, xs in rows:
        if not xs:
            print(f"{label:<28} {0:>5}")
            continue
        xs.sort()
        n = len(xs)
        print(
            f"{label:<28} {n:>5} {xs[n // 4]:>6.1f} {xs[n // 2]:>6.1f} "
            f"{xs[3 * n // 4]:>6.1f} {sum(xs) / n:>6.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
