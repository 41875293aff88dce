"""Who may reach `ninfer serve`, and how: its API keys (`--api-key`, repeatable, or NINFER_API_KEY;
`--api-key-file`, llama-server's: one key a line) and TLS (`--ssl-certfile` / `--ssl-keyfile`, vLLM's
spelling). Both are checked before the port is bound, so a bad file is said at once, not after the weights
load."""

from __future__ import annotations

import ssl
from pathlib import Path

from engine.errors import NinferError


def api_keys(keys: list[str] | None, key_file: str | None) -> tuple[str, ...]:
    """Every key a request may offer: those given on the command line, then the file's (one a line; blank
    lines and lines starting with # skipped)."""
    if any(not k.strip() for k in keys or ()):  # `--api-key "$KEY"` with KEY unset: not an open server
        raise NinferError(
            "--api-key is empty (an unset variable?); give the key, or drop the flag to serve without one"
        )
    out = list(keys or ())
    if key_file is not None:
        path = Path(key_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise NinferError(
                f"--api-key-file {key_file} cannot be read ({why}); give a text file, one key a line"
            ) from None
        out += [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not out:
            raise NinferError(
                f"--api-key-file {key_file} holds no key; write one key a line (a server without keys: drop the flag)"
            )
    return tuple(dict.fromkeys(out))


def tls_options(certfile: str | None, keyfile: str | None) -> dict[str, str]:
    """uvicorn's TLS settings for the certificate and its private key (PEM); {} for plain HTTP. The pair is
    loaded here once, so a wrong path, a key that is not the certificate's or a file that is not PEM is
    one line before anything starts."""
    if certfile is None and keyfile is None:
        return {}
    if certfile is None or keyfile is None:
        given, missing = (
            ("--ssl-certfile", "--ssl-keyfile") if certfile else ("--ssl-keyfile", "--ssl-certfile")
        )
        raise NinferError(f"{given} needs {missing} too: HTTPS takes the PEM certificate and its private key")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not Path(path).expanduser().is_file():
            raise NinferError(f"{flag} {path} does not exist; give the path of a PEM file")
    certfile, keyfile = str(Path(certfile).expanduser()), str(Path(keyfile).expanduser())
    try:
        # an encrypted key fails here rather than prompting on the terminal for its passphrase
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            certfile, keyfile, password=lambda: b""
        )
    except (ssl.SSLError, OSError) as e:
        raise NinferError(
            f"--ssl-certfile {certfile} and --ssl-keyfile {keyfile} do not load as a PEM certificate and its "
            f"private key ({getattr(e, 'reason', None) or e}); check the pair (an encrypted key is not taken)"
        ) from None
    return {"ssl_certfile": certfile, "ssl_keyfile": keyfile}


def exposure_warning(host: str, keys: tuple[str, ...], tls: dict[str, str]) -> str | None:
    """A line for the log when the server listens beyond this machine without a key, or sends its key in
    the clear; None on the loopback, or with both."""
    from engine.api.hosts import listens_on_loopback  # (the server's modules load when serve runs)

    if listens_on_loopback(host):
        return None
    where = "every interface" if host in ("0.0.0.0", "::") else host
    if not keys:
        return (
            f"listening on {where} without --api-key: anyone who reaches the port can use the model; add "
            "--api-key KEY (or --api-key-file FILE)"
        )
    if not tls:
        return (
            f"listening on {where} over plain HTTP: the API key crosses the network readable; add "
            "--ssl-certfile / --ssl-keyfile, or put a TLS proxy in front"
        )
    return None


def origins_warning(origins: tuple[str, ...], keys: tuple[str, ...]) -> str | None:
    """A line for the log when every web page may use a server that takes no key; None otherwise."""
    if "*" in origins and not keys:
        return (
            "--allowed-origins * without --api-key: any web page open in a browser here can use the model; "
            "name the front ends' origins instead, or add --api-key KEY"
        )
    return None
