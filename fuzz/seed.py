#!/usr/bin/env python3
"""Seeds fuzz/corpus/ from the golden fixtures and writes fuzz/protocol.dict (their keys and short strings).

Targets and their header bytes (see each fuzz_targets/*.rs):
  request_bytes  [kind: 0 chat, 1 messages, 2 responses, 3 count_tokens, 4 video] body
  sse_decoder    [n] n piece lengths, stream
  sse_limit      [limit, n] n piece lengths, stream
  stream_bytes   [pair, translation, end, n] n piece lengths, stream
  body_wrappers  [flags, limit, n] n frame lengths, upstream bytes

Run from the repository top or fuzz/: python3 fuzz/seed.py. Idempotent: file names are content hashes.
"""
import hashlib, json, os, pathlib

FUZZ = pathlib.Path(__file__).resolve().parent
FIXTURES = FUZZ.parent / "tests" / "fixtures"
PROTOCOLS = ["chat", "messages", "responses"]
PAIRS = [(c, u) for c in PROTOCOLS for u in PROTOCOLS]


def put(target, data):
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


words = set()


def collect(v):
    if isinstance(v, str) and 0 < len(v) <= 40:
        words.add(v)
    elif isinstance(v, list):
        for x in v:
            collect(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            words.add(k)
            collect(x)


GUARD = {"chat": 1, "messages": 2, "responses": 3}


def line_ends(data, end):
    """The stream with its LF line ends written as `end` (CRLF or CR)."""
    return data.replace(b"\n", end)


for f in sorted((FIXTURES / "video" / "requests").glob("*.json")):
    body = f.read_bytes()
    collect(json.loads(body))
    put("request_bytes", bytes([4]) + body)

for pair in sorted(FIXTURES.iterdir()):
    if "_to_" not in pair.name:
        continue
    client, upstream = pair.name.split("_to_")
    for case in sorted(pair.iterdir()):
        req = case / "client_request.json"
        if req.exists():
            body = req.read_bytes()
            collect(json.loads(body))
            put("request_bytes", bytes([PROTOCOLS.index(client)]) + body)
            if client == "messages":
                # count_tokens takes a messages request without max_tokens
                v = json.loads(body)
                v.pop("max_tokens", None)
                put("request_bytes", bytes([3]) + json.dumps(v).encode())
        reply = case / "upstream_reply.json"
        if reply.exists():
            data = reply.read_bytes()
            # a JSON reply (path 2) and an error reply quoting the credential (path 3), limit 4080
            put("body_wrappers", bytes([0x20, 255, 2, 9, 200]) + data)
            if upstream == "chat" and client == "messages":
                quoted = data.replace(b'"id"', b'"sk-upstream-0123456789"', 1)
                put("body_wrappers", bytes([0x30, 255, 1, 13]) + quoted)
        sse = case / "upstream_reply.sse"
        if sse.exists():
            data = sse.read_bytes()
            for line in data.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    collect(json.loads(line[6:]))
                if line.startswith("event: "):
                    words.add(line[7:])
            put("sse_decoder", bytes([3, 7, 1, 64]) + data)
            pair_index = PAIRS.index((client, upstream))
            # pair, translation 0, clean end, three piece lengths, then the stream
            put("stream_bytes", bytes([pair_index, 0, 0, 3, 5, 1, 200]) + data)
            if client != upstream and PROTOCOLS.index(client) == (PROTOCOLS.index(upstream) + 1) % 3:
                # one stream per upstream case (each appears under two pairs), limit 64 / 1020
                put("sse_limit", bytes([64, 3, 5, 1, 200]) + data)
                guard = GUARD[upstream]
                strip = 4 if upstream == "chat" else 0
                put("body_wrappers", bytes([guard | strip, 255, 3, 7, 64, 1]) + data)
                if case.name < "c":
                    put("sse_limit", bytes([64, 2, 3, 40]) + line_ends(data, b"\r\n"))
                    put("sse_limit", bytes([64, 2, 3, 40]) + line_ends(data, b"\r"))
                    put("body_wrappers", bytes([guard | strip, 64, 2, 3, 40]) + line_ends(data, b"\r\n"))
                    put("body_wrappers", bytes([guard | strip, 64, 2, 3, 40]) + line_ends(data, b"\r"))

with open(FUZZ / "protocol.dict", "w") as f:
    f.write("# Keys, values and event names of the golden fixtures (fuzz/seed.py).\n")
    for w in sorted(words):
        if all(32 <= ord(c) < 127 and c not in '"\\' for c in w):
            f.write('"%s"\n' % w)
            f.write('"\\"%s\\""\n' % w)
