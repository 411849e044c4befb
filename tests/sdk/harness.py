"""Process and loopback-server helpers shared by the SDK tests (fixtures are in conftest.py).

* `start()` runs the real `modelgate` binary ($MODELGATE_BIN, else target/debug/modelgate) with
  stderr in a file; `Proc.wait_for()` reads the bound addresses from that log.
* `start_gateway()` writes a config, starts `modelgate serve` on 127.0.0.1:0 listeners and returns
  the base address (`http://127.0.0.1:PORT`, no `/v1`).
* `FakeUpstream` is a scripted upstream on 127.0.0.1:0: it records every request and answers
  with a hand-written SSE transcript chosen by the request's `model`, and can end the body
  cleanly, or cut the connection mid-stream.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 30.0
# The standalone mock pauses this long between streamed chunks, so a stream through it is
# visibly spread out in time (and a buffering gateway would be caught).
HTTP_MOCK_CHUNK_DELAY_MS = 25

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MOCK_LINE = re.compile(r"mock upstream listening on (http://\S+/v1)")
LISTEN_LINE = re.compile(r'listening on (https?)://(\S+) listener="?([a-z_]+)"?')


def binary() -> Path:
    path = Path(os.environ.get("MODELGATE_BIN", REPO / "target" / "debug" / "modelgate"))
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.is_file():
        pytest.fail(
            f"modelgate binary not found at {path}: run `cargo build` or set MODELGATE_BIN",
            pytrace=False,
        )
    return path


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return ANSI.sub("", self.log.read_text(errors="replace"))

    def wait_for(self, pattern: re.Pattern, count: int = 1) -> list[re.Match]:
        """Polls the stderr log until `pattern` matched `count` lines; fails on exit or timeout."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            found = [m for m in map(pattern.search, self.log_text().splitlines()) if m]
            if len(found) >= count:
                return found
            code = self.popen.poll()
            if code is not None:
                pytest.fail(
                    f"{self.name} exited with {code} before logging {pattern.pattern!r}:\n"
                    f"{self.log_text()}",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.name} did not log {pattern.pattern!r} within {STARTUP_TIMEOUT_S}s:\n"
                    f"{self.log_text()}",
                    pytrace=False,
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def start(
    name: str, args: list[str], workdir: Path, extra_env: Mapping[str, str] | None = None
) -> Proc:
    """Starts the binary with stderr in a file (a file never fills up and blocks the child)."""
    log = workdir / f"{name}.stderr.log"
    env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
    env.pop("MODELGATE_CONFIG", None)
    env.update(extra_env or {})
    with open(log, "wb") as err, open(workdir / f"{name}.stdout.log", "wb") as out:
        popen = subprocess.Popen(
            [str(binary()), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=workdir,
            env=env,
        )
    return Proc(name, popen, log)


def start_gateway(
    name: str,
    workdir: Path,
    config_text: str,
    listeners: set[str],
    extra_env: Mapping[str, str] | None = None,
) -> tuple[Proc, dict[str, str]]:
    """Starts `modelgate serve` on `config_text`; returns it and `{listener: "http://ADDR"}`.

    The caller stops the process (`Proc.stop()`)."""
    config = workdir / f"{name}.toml"
    config.write_text(config_text)
    proc = start(name, ["serve", "--config", str(config)], workdir, extra_env)
    try:
        found = {m.group(3): m for m in proc.wait_for(LISTEN_LINE, count=len(listeners))}
        assert set(found) == listeners, proc.log_text()
    except BaseException:
        proc.stop()
        raise
    return proc, {n: f"{m.group(1)}://{m.group(2)}" for n, m in found.items()}


# ---------------------------------------------------------------------------------------------
# A scripted upstream
# ---------------------------------------------------------------------------------------------


def sse_data(payload: Any) -> bytes:
    """A Chat Completions frame: `data:` only (protocols.md §0, §A.5)."""
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """An Anthropic or Responses frame: `event:` equal to the payload's `type`, then `data:`."""
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or the raw text if it was not JSON


# "clean": the body ends properly (last chunk of the chunked encoding) after the frames;
# "cut": the socket is shut down after the frames, without ending the chunked body.
Ending = Literal["clean", "cut"]


@dataclass
class Script:
    """What the fake answers to one model: the path it expects, and the frames of its reply."""

    path: str
    frames: Callable[[Any], list[bytes]]  # from the parsed request body
    ending: Ending = "clean"
    status: int = 200
    content_type: str = "text/event-stream"
    frame_delay_s: float | None = None  # pause after each frame; None: the fake's default


@dataclass
class FakeUpstream:
    """A loopback upstream that replays `Script`s chosen by the request's `model` field."""

    frame_delay_s: float = 0.01
    scripts: dict[str, Script] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.reply_json(404, {"error": {"message": "no GET here", "type": "not_found"}})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                with fake.lock:
                    fake.requests.append(Recorded("POST", self.path, headers, body))
                model = body.get("model") if isinstance(body, dict) else None
                script = fake.scripts.get(model) if isinstance(model, str) else None
                if script is None or script.path != self.path:
                    self.reply_json(
                        404,
                        {
                            "error": {
                                "message": f"fake upstream: no script for {model!r} at {self.path}",
                                "type": "not_found",
                            }
                        },
                    )
                    return
                self.send_response(script.status)
                self.send_header("content-type", script.content_type)
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for frame in script.frames(body):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                        self.wfile.flush()
                        delay = script.frame_delay_s
                        time.sleep(fake.frame_delay_s if delay is None else delay)
                    if script.ending == "clean":
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    else:
                        # The upstream dies mid-body: no terminating chunk, connection gone.
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    self.close_connection = True

            def reply_json(self, status: int, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, model: str, script: Script) -> str:
        self.scripts[model] = script
        return model

    def requests_for(self, model: str) -> list[Recorded]:
        with self.lock:
            return [
                r
                for r in self.requests
                if isinstance(r.body, dict) and r.body.get("model") == model
            ]

    def only_request_for(self, model: str) -> Recorded:
        found = self.requests_for(model)
        assert len(found) == 1, f"expected one upstream request for {model!r}, got {len(found)}"
        return found[0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
