"""A hub repo id where a model path goes: its download on this machine (ninfer fetch's folder, the Hugging
Face cache's snapshot), or a sentence saying how to fetch it pinned."""

from __future__ import annotations

import shutil

import huggingface_hub.constants
import pytest
from conftest import save_tiny, tiny_hf_model

from engine.errors import NinferError
from engine.formats.local_repo import looks_like_repo_id, resolve_repo_id
from engine.llm import LLM
from engine.models.loader import default_model_path
from engine.plan.model import resolve as resolve_plan_model

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


@pytest.fixture
def homes(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "ninfer"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path / "ninfer" / "models", tmp_path / "hf"


def test_the_hf_cache_snapshot_of_refs_main_is_served(homes, tmp_path):
    _, hf = homes
    repo = hf / "models--acme--tiny-qwen3"
    save_tiny(tiny_hf_model("qwen3", tied=False), repo / "snapshots" / COMMIT_A)
    (repo / "snapshots" / COMMIT_B).mkdir()  # an older snapshot refs/main no longer names
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT_A)
    assert resolve_repo_id("acme/tiny-qwen3") == repo / "snapshots" / COMMIT_A
    llm = LLM("acme/tiny-qwen3", max_context=64)
    assert str(repo / "snapshots" / COMMIT_A) in llm.description
    planned = resolve_plan_model("acme/tiny-qwen3", None, None, None, False, False)  # ninfer plan too
    assert planned.serve_arg == str(repo / "snapshots" / COMMIT_A)
    with pytest.raises(NinferError, match="no download of acme/tiny-qwen3 at ccccccc is on this machine"):
        resolve_repo_id("acme/tiny-qwen3@ccccccc")


def test_ninfer_fetch_folders(homes):
    fetched, _ = homes
    one = fetched / "acme--smol-gguf" / COMMIT_A
    one.mkdir(parents=True)
    shutil.copy(default_model_path(), one / "smol.Q4_1.gguf")
    assert resolve_repo_id("acme/smol-gguf") == one / "smol.Q4_1.gguf"
    (fetched / "acme--smol-gguf" / COMMIT_B).mkdir()
    with pytest.raises(
        NinferError, match=r"acme/smol-gguf is on this machine at 2 commits \(aaaaaaaaaaaa, bbbb"
    ):
        resolve_repo_id("acme/smol-gguf")
    assert resolve_repo_id(f"acme/smol-gguf@{COMMIT_A[:8]}") == one / "smol.Q4_1.gguf"
    shutil.copy(default_model_path(), one / "smol.Q8_0.gguf")
    with pytest.raises(
        NinferError, match=r"holds 2 model files \(smol.Q4_1.gguf, smol.Q8_0.gguf\); pass the one"
    ):
        resolve_repo_id(f"acme/smol-gguf@{COMMIT_A}")


def test_a_repo_id_found_nowhere_is_told_how_to_fetch_it(homes):
    with pytest.raises(
        NinferError,
        match=r"Qwen/Qwen3-8B is not a path here, and no download of Qwen/Qwen3-8B is on this machine .*"
        r"fetch it pinned: ninfer fetch Qwen/Qwen3-8B --revision COMMIT",
    ):
        LLM("Qwen/Qwen3-8B")
    assert looks_like_repo_id("Qwen/Qwen3-8B") and looks_like_repo_id("a/b@0123abc")
    assert (
        not looks_like_repo_id("./a/b")
        and not looks_like_repo_id("/models/x")
        and not looks_like_repo_id("x")
    )
