"""Session fixtures shared by the SDK tests: a work directory, the standalone mock upstream, and
a scripted fake upstream. Helpers live in harness.py (pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from harness import HTTP_MOCK_CHUNK_DELAY_MS, MOCK_LINE, FakeUpstream, start


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("modelgate-sdk")


@pytest.fixture(scope="session")
def mock_upstream(workdir: Path) -> Iterator[str]:
    """`modelgate mock` on its own port; yields its base URL (`http://127.0.0.1:PORT/v1`)."""
    proc = start(
        "mock",
        ["mock", "--listen", "127.0.0.1:0", "--chunk-delay-ms", str(HTTP_MOCK_CHUNK_DELAY_MS)],
        workdir,
    )
    try:
        yield proc.wait_for(MOCK_LINE)[0].group(1)
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    """The scripted upstream (harness.FakeUpstream); tests register their scripts on it."""
    fake = FakeUpstream()
    try:
        yield fake
    finally:
        fake.close()
