"""`ninfer fetch`: download model files pinned to a commit, resumable, sha256-verified."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ninfer_cli.errors import exits_cleanly


@exits_cleanly
def fetch(
    repo_id: Annotated[str, typer.Argument(help="Hub repository, e.g. Qwen/Qwen3-0.6B.")],
    revision: Annotated[str, typer.Option(help="The commit (40 hex characters) to download.")],
    file: Annotated[
        list[str] | None, typer.Option("--file", help="A file to download (repeatable). Default: every file.")
    ] = None,
    include: Annotated[
        str | None, typer.Option(help="Download the files matching this glob, e.g. '*.ninfer'.")
    ] = None,
    sha256: Annotated[str | None, typer.Option(help="Expected sha256 of the one file asked for.")] = None,
    dir: Annotated[
        Path | None,
        typer.Option("--dir", help="Destination folder. Default: ~/.cache/ninfer/models/<repo>/<commit>."),
    ] = None,
    allow_unpinned: Annotated[
        bool,
        typer.Option("--allow-unpinned", help="Accept a branch or tag; prints the commit it resolved to."),
    ] = False,
):
    """Download model files pinned to a commit (resumable, sha256-verified)."""
    from engine.errors import NinferError
    from engine.formats.hub import check_artifact, default_dir, fetch_file, list_files, resolve_revision

    console = Console(stderr=True)
    files = list(file or [])
    if sha256 is not None and (len(files) != 1 or include):
        raise NinferError("--sha256 checks one file: pass it with exactly one --file")
    commit, resolved = resolve_revision(repo_id, revision, allow_unpinned)
    if resolved:
        console.print(f"{revision} resolved to commit {commit}; pin it next time with --revision {commit}")
    if include:
        files += list_files(repo_id, commit, include)
    if not files:
        files = list_files(repo_id, commit, "*")
    dest_dir = dir or default_dir(repo_id, commit)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    fetched = []
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, done: int, total: int | None) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)

        for name in dict.fromkeys(files):
            fetched.append(fetch_file(repo_id, name, commit, dest_dir, sha256, progress))
    for f in fetched:
        how = (
            "already there"
            if f.cached
            else (f"resumed at byte {f.resumed_from}" if f.resumed_from else "downloaded")
        )
        print(f"{f.path}  sha256 {f.sha256}  ({f.size} bytes, {how})")
    for f in fetched:
        check_artifact(f.path)
    model = next((f.path for f in fetched if f.path.suffix in (".ninfer", ".gguf")), dest_dir)
    print(f"model: {model}")
    print(f"run it: ninfer serve {model}")
