"""`ninfer fetch` against a local hub server (tests/cli/hub_server.py) through HF_ENDPOINT."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest
from hub_server import HubServer, HubState

REPO = "acme/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _container(version: int) -> bytes:
    header = {
        "t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "__metadata__": {"format": "ninfer", "container_version": str(version)},
    }
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + b"\x00" * 8


BIG = os.urandom(3_000_000)
FILES = {
    "model.ninfer": _container(1),
    "newer.ninfer": _container(2),
    "weights.bin": BIG,
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
}


@pytest.fixture
def hub():
    state = HubState(REPO, COMMIT, dict(FILES), branches={"main": COMMIT})
    with HubServer(state) as server:
        yield server


def ninfer_fetch(hub, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NINFER_HOME": str(tmp_path / "home"),
    }
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "ninfer_cli.main", "fetch", REPO, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_pinned_download_lands_verified(hub, tmp_path):
    dest = tmp_path / "out"
    proc = ninfer_fetch(hub, tmp_path, "--revision", COMMIT, "--file", "model.ninfer", "--dir", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert (dest / "model.ninfer").read_bytes() == FILES["model.ninfer"]
    assert hashlib.sha256(FILES["model.ninfer"]).hexdigest() in proc.stdout
    assert f"run it: ninfer serve {dest / 'model.ninfer'}" in proc.stdout
    assert not list((dest / ".partial").glob("*"))


def test_sha256_mismatch_keeps_nothing(hub, tmp_path):
    dest = tmp_path / "out"
    wrong = "0" * 64
    proc = ninfer_fetch(
        hub, tmp_path, "--revision", COMMIT, "--file", "weights.bin", "--sha256", wrong, "--dir", str(dest)
    )
    assert proc.returncode == 2
    assert wrong in proc.stderr and hashlib.sha256(BIG).hexdigest() in proc.stderr
    assert not (dest / "weights.bin").exists()


def test_broken_connection_resumes_with_a_range_request(hub, tmp_path):
    dest = tmp_path / "out"
    hub.state.drop_after = 1_000_000
    args = ("--revision", COMMIT, "--file", "weights.bin", "--dir", str(dest))
    first = ninfer_fetch(hub, tmp_path, *args)
    assert first.returncode == 2 and "run the same command again to resume" in first.stderr
    assert not (dest / "weights.bin").exists()
    second = ninfer_fetch(hub, tmp_path, *args)
    assert second.returncode == 0, second.stderr
    assert (dest / "weights.bin").read_bytes() == BIG
    resumed_at = int(hub.state.ranges[-1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 1_000_000  # what arrived before the drop is not fetched again
    assert f"resumed at byte {resumed_at}" in second.stdout


def test_unknown_revision_is_one_line(hub, tmp_path):
    proc = ninfer_fetch(hub, tmp_path, "--revision", "f" * 40, "--file", "model.ninfer")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {REPO} has no revision {'f' * 40}; check the commit id on the hub"


def test_branch_needs_allow_unpinned_and_then_prints_the_commit(hub, tmp_path):
    refused = ninfer_fetch(hub, tmp_path, "--revision", "main", "--file", "config.json")
    assert refused.returncode == 2 and "--allow-unpinned" in refused.stderr
    ok = ninfer_fetch(hub, tmp_path, "--revision", "main", "--allow-unpinned", "--file", "config.json")
    assert ok.returncode == 0, ok.stderr
    assert f"main resolved to commit {COMMIT}" in ok.stderr


def test_newer_container_gets_the_container_message(hub, tmp_path):
    proc = ninfer_fetch(
        hub, tmp_path, "--revision", COMMIT, "--file", "newer.ninfer", "--dir", str(tmp_path / "o")
    )
    assert proc.returncode == 2
    assert "this artifact is container v2; this ninfer reads v1–v1" in proc.stderr


def test_include_glob_and_offline_cache(hub, tmp_path):
    proc = ninfer_fetch(hub, tmp_path, "--revision", COMMIT, "--include", "*.json")
    assert proc.returncode == 0, proc.stderr
    cached = tmp_path / "home" / "models" / "acme--tiny-model" / COMMIT / "config.json"
    assert cached.read_bytes() == FILES["config.json"]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "NINFER_HOME": str(tmp_path / "home"),
    }
    cmd = [
        sys.executable,
        "-m",
        "ninfer_cli.main",
        "fetch",
        REPO,
        "--revision",
        COMMIT,
        "--file",
        "config.json",
    ]
    offline = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert offline.returncode == 0, offline.stderr
    assert "already there" in offline.stdout
