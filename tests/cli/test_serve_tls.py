"""`ninfer serve` over HTTPS (--ssl-certfile / --ssl-keyfile) and with several API keys (--api-key
repeated, --api-key-file): both checked before the port is bound (ninfer_cli/access.py)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import pytest
from conftest import run_serve
from serve_process import start_serve

from engine.errors import NinferError
from ninfer_cli.access import api_keys, exposure_warning, origins_warning, tls_options

TLS = Path(__file__).parent / "tls"
CERT, KEY, ENCRYPTED = TLS / "localhost.pem", TLS / "localhost-key.pem", TLS / "localhost-key-encrypted.pem"


def test_keys_come_from_the_flags_and_the_file(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nalpha\n\n  beta  \nalpha\n")
    assert api_keys(["gamma"], str(keys)) == ("gamma", "alpha", "beta")
    assert api_keys(None, None) == () and api_keys(["k"], None) == ("k",)
    with pytest.raises(NinferError, match=r"--api-key is empty \(an unset variable\?\); give the key"):
        api_keys(["k", ""], None)
    (tmp_path / "empty.txt").write_text("# none yet\n\n")
    with pytest.raises(NinferError, match="holds no key"):
        api_keys(None, str(tmp_path / "empty.txt"))
    with pytest.raises(NinferError, match="cannot be read \\(No such file or directory\\)"):
        api_keys(None, str(tmp_path / "missing.txt"))


def test_the_certificate_pair_is_checked_at_once(tmp_path):
    assert tls_options(str(CERT), str(KEY)) == {"ssl_certfile": str(CERT), "ssl_keyfile": str(KEY)}
    assert tls_options(None, None) == {}
    cases = [
        ((str(CERT), None), "--ssl-certfile needs --ssl-keyfile too"),
        ((None, str(KEY)), "--ssl-keyfile needs --ssl-certfile too"),
        ((str(tmp_path / "no.pem"), str(KEY)), "--ssl-certfile .*no.pem does not exist"),
        ((str(CERT), str(CERT)), "do not load as a PEM certificate and its private key"),  # no key in it
        ((str(CERT), str(ENCRYPTED)), "an encrypted key is not taken"),  # refused, never a passphrase prompt
    ]
    for (cert, key), words in cases:
        with pytest.raises(NinferError, match=words):
            tls_options(cert, key)


def test_listening_beyond_this_machine_without_a_key_or_tls_is_said():
    tls = {"ssl_certfile": "c", "ssl_keyfile": "k"}
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert exposure_warning(host, (), {}) is None
    assert exposure_warning("0.0.0.0", (), {}).startswith("listening on every interface without --api-key")
    assert "over plain HTTP: the API key crosses the network readable" in exposure_warning(
        "192.168.1.5", ("k",), {}
    )
    assert exposure_warning("0.0.0.0", ("k",), tls) is None


def test_every_origin_without_a_key_is_said():
    assert origins_warning(("*",), ()).startswith("--allowed-origins * without --api-key")
    assert origins_warning(("*",), ("k",)) is None
    assert origins_warning(("http://localhost",), ()) is None


def test_a_malformed_allowed_origin_ends_serve_in_one_line_before_loading():
    proc = run_serve("--allowed-origins", "localhost:3000", "--port", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: --allowed-origins 'localhost:3000' is not an origin")
    assert proc.stderr.count("\n") == 1


def test_bad_tls_flags_end_serve_in_one_line_before_loading():
    proc = run_serve("--ssl-certfile", str(CERT))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --ssl-certfile needs --ssl-keyfile too: HTTPS takes the PEM certificate and its private key"
    )


def test_https_with_several_keys(tmp_path):
    """Answers over HTTPS with the certificate (a plain HTTP request to the port gets no answer); any of
    the keys from the flag and the file is taken, another key or none gets 401."""
    keys = tmp_path / "keys.txt"
    keys.write_text("alpha\nbeta\n")
    trust = ssl.create_default_context(cafile=str(CERT))
    loading: list[httpx.Response] = []  # while the model loads: 503s, over HTTPS too
    proc, port = start_serve(
        "--max-context", "2k", "--ssl-certfile", str(CERT), "--ssl-keyfile", str(KEY),
        "--api-key", "gamma", "--api-key-file", str(keys), verify=trust, answers=loading,
    )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    assert all(r.status_code == 503 and r.json()["status"] == "loading" for r in loading)
    try:
        for key in ("alpha", "beta", "gamma"):
            r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, verify=trust)
            assert r.status_code == 200, key
        assert httpx.get(f"{url}/v1/models", headers={"x-api-key": "delta"}, verify=trust).status_code == 401
        assert httpx.get(f"{url}/v1/models", verify=trust).status_code == 401
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        with pytest.raises(httpx.TransportError):  # a client that does not trust the certificate
            httpx.get(f"{url}/health", timeout=5)
        # ninfer chat --url: refused in words that say what to do, then trusted through SSL_CERT_FILE
        chat = [sys.executable, "-m", "ninfer_cli.main", "chat", "--url", url, "--api-key", "beta"]
        chat += ["--prompt", "What is the capital of France?", "--max-tokens", "12"]
        env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
        untrusted = subprocess.run(chat, capture_output=True, text=True, env=env, timeout=120)
        assert untrusted.returncode == 2
        assert (
            "HTTPS certificate is not trusted (self-signed certificate); for a self-signed one, run with "
            "SSL_CERT_FILE=CERT.pem" in untrusted.stderr
        )
        trusted = subprocess.run(
            chat, capture_output=True, text=True, env={**env, "SSL_CERT_FILE": str(CERT)}, timeout=120
        )
        assert trusted.returncode == 0 and trusted.stdout.strip(), trusted.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"on https://127.0.0.1:{port}" in err and "Traceback" not in err


def test_a_malformed_allowed_host_ends_serve_in_one_line_before_loading():
    proc = run_serve("--allowed-hosts", "http://ninfer.example.com", "--port", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(
        "error: --allowed-hosts 'http://ninfer.example.com' is not a host name"
    )
    assert proc.stderr.count("\n") == 1
