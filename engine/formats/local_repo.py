"""A hub repository id given where a model path goes (`ninfer serve Qwen/Qwen3-8B`, as vLLM takes it), found
on this machine without the network: in `ninfer fetch`'s folder (engine/formats/hub.default_dir), else in
the Hugging Face cache (the snapshot its refs/main names). `OWNER/NAME@COMMIT` picks a commit; a repo
id found nowhere is told how to fetch it, pinned."""

from __future__ import annotations

import re
from pathlib import Path

from engine.errors import NinferError
from engine.paths import ninfer_home

REPO_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<commit>[0-9a-f]{7,40}))?")
MODEL_FILES = ("*.gguf", "*.ninfer")


def looks_like_repo_id(model: str) -> bool:
    return REPO_ID.fullmatch(model) is not None and not model.startswith((".", "~"))


def resolve_repo_id(model: str) -> Path:
    """The checkpoint folder or model file of repo id `model` on this machine; NinferError when none."""
    match = REPO_ID.fullmatch(model)
    repo, commit = match["repo"], match["commit"]
    folders = _fetched(repo) + _hf_cache(repo)
    if commit:
        folders = [f for f in folders if f.name.startswith(commit)]
    fetch = f"ninfer fetch {repo} --revision COMMIT (a 40-hex commit id), then serve the path it prints"
    if not folders:
        where = f" at {commit}" if commit else ""
        raise NinferError(
            f"{model} is not a path here, and no download of {repo}{where} is on this machine (ninfer fetch's "
            f"folder, the Hugging Face cache); fetch it pinned: {fetch}"
        )
    commits = sorted({f.name for f in folders})
    if len(commits) > 1:
        raise NinferError(
            f"{repo} is on this machine at {len(commits)} commits ({', '.join(c[:12] for c in commits)}); "
            f"pick one: {repo}@COMMIT"
        )
    return _model_in(folders[0])


def _fetched(repo: str) -> list[Path]:
    root = ninfer_home() / "models" / repo.replace("/", "--")
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _hf_cache(repo: str) -> list[Path]:
    """The HF cache's snapshot of refs/main (the commit a plain download resolved to), or every snapshot
    when no ref is kept."""
    from huggingface_hub.constants import HF_HUB_CACHE

    root = Path(HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        return []
    ref = root / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return [snapshots / ref.read_text().strip()]
    return sorted(p for p in snapshots.iterdir() if p.is_dir())


def _model_in(folder: Path) -> Path:
    """A checkpoint folder as it is; a download of model files alone: the one file (a GGUF repository holds
    several quantizations: name one)."""
    if (folder / "config.json").is_file():
        return folder
    files = sorted(f for pattern in MODEL_FILES for f in folder.glob(pattern))
    if len(files) == 1:
        return files[0]
    if not files:
        raise NinferError(f"{folder} holds no config.json, .gguf or .ninfer file; pass the model file's path")
    names = ", ".join(f.name for f in files[:6]) + (", ..." if len(files) > 6 else "")
    raise NinferError(f"{folder} holds {len(files)} model files ({names}); pass the one to run as its path")
