#!/usr/bin/env python3
"""Seeds fuzz/corpus/ from the golden fixtures and writes fuzz/protocol.dict (their keys and short strings).

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

with open(FUZZ / "protocol.dict", "w") as f:
    f.write("# Keys, values and event names of the golden fixtures (fuzz/seed.py).\n")
    for w in sorted(words):
        if all(32 <= ord(c) < 127 and c not in '"\\' for c in w):
            f.write('"%s"\n' % w)
            f.write('"\\"%s\\""\n' % w)
