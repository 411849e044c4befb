#!/usr/bin/env python3
"""The gateway's (or nginx's) own time on a request's critical path, from the kernel's
timestamps of its system calls (`perf script` output of benches/critical_path.sh):

- request: from the read that brought the client's request to the write that sends it upstream;
- reply: from the read that brought the upstream's answer to the write that sends it to the
  client (the first write of a stream);
- upstream: from that write to the read that brings the answer (the upstream's time, and the
  scheduler's: how soon the upstream and then the proxy get a CPU);
- wake: from the event loop's wake-up to that client read, on a connection that had served a
  request before.

Everything else a client waits for (the loopback, the upstream, the scheduler) is the same for
any proxy. Each thread's calls are read in order, per connection: a read from a client starts a
request, the next write to a connection that is not a client's is its upstream, the next read
from that one is the answer, and the next write to the client sends it.
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
    reply, wake, waited = [], [], []
    for events in calls(path):
        # One thread serves many connections: everything is kept per connection (descriptor).
        clients = set()  # descriptors a request was read from
        asked = {}  # client -> when its request was read, until it goes upstream
        upstream_of = {}  # upstream -> the client whose request it carries
        upstreams = set()  # descriptors requests went out on (a stream's later reads come here)
        answering = {}  # client -> when its answer was read, until the first write of it
        sent_at = {}  # upstream -> when the request went out on it, until its answer is read
        reused_at = {}  # client -> whether the request came on a connection used before
        woke, fd, entered = None, None, 0.0
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
                if fd in upstream_of:
                    answering[upstream_of.pop(fd)] = t
                    if fd in sent_at:
                        waited.append(t - sent_at.pop(fd))
                elif fd not in upstreams and fd not in answering:
                    reused_at[fd] = fd in clients
                    if reused_at[fd] and woke is not None:
                        wake.append(entered - woke)
                    clients.add(fd)
                    asked[fd] = t
            elif name in ("sys_enter_sendto", "sys_enter_writev"):
                fd = int(FD.search(args).group(1), 16)
                if fd in answering:
                    reply.append(t - answering.pop(fd))
                elif fd not in clients and asked:
                    # The request read last is the one being sent: a loop reads a request and
                    # forwards it in one go.
                    client = max(asked, key=asked.get)
                    request[reused_at[client]].append(t - asked.pop(client))
                    upstream_of[fd] = client
                    sent_at[fd] = t
                    upstreams.add(fd)
                    clients.discard(fd)
    rows = [
        ("request, new connection", request[False]),
        ("request, reused connection", request[True]),
        ("reply", reply),
        ("upstream, send to answer", waited),
        ("wake to read, reused", wake),
    ]
    print(f"{'µs':<28} {'n':>5} {'p25':>6} {'p50':>6} {'p75':>6} {'mean':>6} {'p99':>7} {'max':>7}")
    for label, xs in rows:
        if not xs:
            print(f"{label:<28} {0:>5}")
            continue
        xs.sort()
        n = len(xs)
        print(
            f"{label:<28} {n:>5} {xs[n // 4]:>6.1f} {xs[n // 2]:>6.1f} "
            f"{xs[3 * n // 4]:>6.1f} {sum(xs) / n:>6.1f} {xs[99 * n // 100]:>7.1f} {xs[-1]:>7.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
