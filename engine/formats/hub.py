"""Revision-pinned, resumable, sha256-verified downloads from a Hugging Face hub (`ninfer fetch`).

Metadata comes from huggingface_hub (file HEAD: commit, size, LFS sha256; repo listing for globs); the
bytes are streamed here so that the sha256 is computed as they arrive and a partial file resumes with a
Range request. A file reaches its destination only once verified. HF_ENDPOINT, HF_TOKEN and
HF_HUB_OFFLINE are read at call time.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import NinferError
from engine.paths import ninfer_home

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20

Progress = Callable[[str, int, int | None], None]  # (file name, bytes so far, total bytes)


def default_dir(repo_id: str, commit: str) -> Path:
    return ninfer_home() / "models" / repo_id.replace("/", "--") / commit


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_error(e: Exception, repo_id: str, revision: str, filename: str | None = None) -> NinferError:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, RevisionNotFoundError):
        return NinferError(f"{repo_id} has no revision {revision}; check the commit id on the hub")
    if isinstance(e, EntryNotFoundError):
        return NinferError(f"{repo_id} at {revision[:12]} has no file {filename}; check --file")
    if isinstance(e, GatedRepoError):
        return NinferError(f"{repo_id} is gated; accept its terms on the hub and set HF_TOKEN")
    if isinstance(e, RepositoryNotFoundError):
        return NinferError(f"{repo_id} was not found (or is private: set HF_TOKEN)")
    return NinferError(f"the hub at {_endpoint()} failed: {e}; retry, or check HF_ENDPOINT and the network")


def resolve_revision(repo_id: str, revision: str, allow_unpinned: bool) -> tuple[str, bool]:
    """(commit, was_resolved): a 40-hex commit as it is; a branch or tag only with allow_unpinned."""
    if COMMIT_RE.match(revision):
        return revision, False
    if not allow_unpinned:
        raise NinferError(
            f"--revision {revision} is not a commit id (40 hex characters); a branch or tag can change under "
            "you — pin a commit, or pass --allow-unpinned to resolve it once"
        )
    if _offline():
        raise NinferError("HF_HUB_OFFLINE is set, so the branch cannot be resolved; pass a commit id")
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=_endpoint(), token=_token()).model_info(repo_id, revision=revision)
    except Exception as e:  # noqa: BLE001 - mapped to one sentence
        raise _hub_error(e, repo_id, revision) from e
    return info.sha, True


def list_files(repo_id: str, commit: str, pattern: str) -> list[str]:
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=_endpoint(), token=_token()).model_info(repo_id, revision=commit)
        files = [s.rfilename for s in info.siblings or ()]
    except Exception as e:  # noqa: BLE001
        raise _hub_error(e, repo_id, commit) from e
    matched = sorted(f for f in files if fnmatch.fnmatch(f, pattern))
    if not matched:
        raise NinferError(f"no file of {repo_id} at {commit[:12]} matches --include {pattern}")
    return matched


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    size: int
    resumed_from: int  # bytes that were already there from an interrupted download
    cached: bool  # already complete at the destination (nothing downloaded)


def fetch_file(
    repo_id: str,
    filename: str,
    commit: str,
    dest_dir: Path,
    expected_sha256: str | None = None,
    progress: Progress | None = None,
) -> Fetched:
    """Download one file of `repo_id` at `commit` into dest_dir, resuming a partial one, verifying sha256."""
    if expected_sha256 is not None and not SHA256_RE.match(expected_sha256.lower()):
        raise NinferError(f"--sha256 {expected_sha256} is not a sha256 (64 hex characters)")
    dest = dest_dir / filename
    partial = dest_dir / ".partial" / (filename + ".incomplete")
    if _offline():
        if dest.is_file():
            return Fetched(dest, _check_existing(dest, expected_sha256), dest.stat().st_size, 0, True)
        raise NinferError(f"HF_HUB_OFFLINE is set and {dest} is not downloaded yet; unset it to download")
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=_endpoint())
    try:
        meta = get_hf_file_metadata(url, token=_token())
    except Exception as e:  # noqa: BLE001
        raise _hub_error(e, repo_id, commit, filename) from e
    hub_sha = meta.etag if meta.etag and SHA256_RE.match(meta.etag) else None  # LFS files: the content sha256
    if dest.is_file() and dest.stat().st_size == meta.size:
        digest = _check_existing(dest, expected_sha256 or hub_sha)
        return Fetched(dest, digest, meta.size, 0, True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if meta.size is not None and have > meta.size:
        partial.unlink()
        have = 0
    # the bytes already there enter the hash once; the rest is hashed as it arrives
    sha = _hash_file(partial) if have else hashlib.sha256()
    headers = build_hf_headers(token=_token())
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
    done = have
    try:
        with get_session().stream(
            "GET", meta.location or url, headers=headers, follow_redirects=True, timeout=60
        ) as r:
            if r.status_code == 416:  # the partial is already whole
                pass
            else:
                r.raise_for_status()
                if have and r.status_code != 206:  # the server ignored the Range: start over
                    sha, done = hashlib.sha256(), 0
                mode = "ab" if done else "wb"
                with open(partial, mode) as f:
                    for chunk in r.iter_bytes():  # as they arrive, so a broken connection loses none
                        f.write(chunk)
                        sha.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress(filename, done, meta.size)
    except Exception as e:  # noqa: BLE001 - the partial stays for the next run to resume
        raise NinferError(
            f"the download of {filename} broke off at {done} of {meta.size} bytes ({type(e).__name__}); "
            "run the same command again to resume"
        ) from e
    digest = sha.hexdigest()
    for want, what in ((expected_sha256, "--sha256"), (hub_sha, "the hub's sha256")):
        if want is not None and digest != want.lower():
            partial.unlink()
            raise NinferError(
                f"{filename} does not match {what}: expected {want.lower()}, got {digest}; nothing was kept — "
                "check the hash, or download again"
            )
    if meta.size is not None and done != meta.size:
        raise NinferError(
            f"{filename} arrived with {done} of {meta.size} bytes; run the command again to resume"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, dest)
    return Fetched(dest, digest, done, have, False)


def _hash_file(path: Path):
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha


def _check_existing(path: Path, expected: str | None) -> str:
    digest = _hash_file(path).hexdigest()
    if expected is not None and digest != expected.lower():
        raise NinferError(
            f"{path} is already there but does not match: expected {expected.lower()}, got {digest}; delete it "
            "and fetch again"
        )
    return digest


def check_artifact(path: Path) -> None:
    """After a download: a .ninfer gets the container checks (version included), a .safetensors its header."""
    from engine.formats.container import SUFFIX, read_header

    if path.suffix == SUFFIX:
        read_header(path)
    elif path.suffix == ".safetensors":
        from engine.formats.hf_dir import check_safetensors_header

        check_safetensors_header(path)
