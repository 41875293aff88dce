"""The prefix cache kept across restarts (`--prefix-cache-file`): a long agent conversation or a repository
read into the prompt is not computed again after the server restarts.

At shutdown (`LLM.save_prefix_cache`) the file takes the prefix cache's pages, oldest first: the host
tier's (engine/cache/host_pool.py), then the GPU pool's unreferenced cached pages in LRU order, then those
running requests hold; as many as the host tier has slots (the newest), each named by its prefix hash. A
hybrid model's recurrent-state snapshots (engine/cache/state_pool.py) go with them, the host tier's then the
GPU slots': a page hit is usable there only with the state at that position. At start-up the pages are
read into the host tier (a later request with that prefix copies them to the GPU, as after any eviction),
the newest snapshots into the GPU slots and those before them into the host tier.

The file is one safetensors file: `page.i` [n, *page shape] per page tensor of the KV caches (data and
scales, every attention layer, the draft model's too), `state.j` [m, *slot shape] per recurrent-state
tensor, and in its metadata the page and snapshot hashes and the identity of what wrote it: the model's
files (name, size, a hash of their first and last MiB), the draft model's, the rope scaling, the device
type, dtype, weight quantization, int8 prefill and the tensors' shapes and dtypes. A file of another
identity is left unread (said in the log) and replaced at shutdown; a file that is not such a file is
refused at start-up, so a wrong path never overwrites a model. Written to a temporary name and moved into
place, so a crash mid-write leaves the previous file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import torch

from engine.errors import NinferError
from engine.formats.safetensors_writer import Entry, write
from engine.models.loader import model_path
from engine.worker.host_kv import page_tensors

log = logging.getLogger("ninfer")
FORMAT = "ninfer-prefix-cache"
VERSION = 1
SAMPLE = 1 << 20  # bytes hashed at each end of a model file
CHUNK_ROWS = 64  # pages (or snapshots) gathered and written at a time
WEIGHT_SUFFIXES = (".json", ".safetensors", ".gguf", ".ninfer", ".bin")


def fingerprint(path: Path) -> list[list]:
    """What names a checkpoint's contents without reading all of it: per file (a folder's config and
    weight files) its name, size and a hash of its first and last MiB."""
    if not path.exists():  # dummy:SHAPE[:RECIPE]: seeded random weights, named by the spec alone
        return [[str(path)]]
    files = sorted(f for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES) if path.is_dir() else [path]
    out = []
    for f in files:
        size = f.stat().st_size
        digest = hashlib.blake2b(digest_size=16)
        with open(f, "rb") as fh:
            digest.update(fh.read(SAMPLE))
            if size > SAMPLE:
                fh.seek(max(SAMPLE, size - SAMPLE))
                digest.update(fh.read(SAMPLE))
        out.append([f.name, size, digest.hexdigest()])
    return out


def state_tensors(runner) -> list[torch.Tensor]:
    """A hybrid model's recurrent-state tensors, [slots, ...] each (none for a plain decoder)."""
    return [t for layer in runner._state_layers for t in (layer.conv_state, layer.ssm_state)]


def identity(llm) -> dict:
    """What the pages' values depend on: the same for the writer and the reader, or the file is not read."""
    config, runner = llm.engine_config, llm.runner

    def shapes(tensors):
        return [[list(t.shape[1:]), str(t.dtype)] for t in tensors]

    return {
        "model": fingerprint(model_path(config.model or None)),
        "draft_model": fingerprint(model_path(config.draft_model)) if config.draft_model else None,
        "rope_scaling": llm.model_config.rope_scaling,
        "device": runner.device.type,
        "dtype": str(config.torch_dtype),
        "weight_quant": config.weight_quant,
        "int8_prefill": config.int8_prefill,
        "block_size": config.block_size,
        "pages": shapes(page_tensors(runner.kv_caches)),
        "states": shapes(state_tensors(runner)),
    }


@torch.inference_mode()
def save(llm, path: str) -> tuple[int, int]:
    """Write the prefix cache to `path` (between steps, or once the engine stopped): (pages, snapshots)."""
    pool, runner = llm.scheduler.block_pool, llm.runner
    pairs = runner.host_kv.pairs  # (device page tensor, host page tensor)
    # a page whose copy is still pending (scheduled, the step not run) does not hold its KV yet
    pending_slots = {slot for _, slot in pool.swap_out}
    pending_blocks = {block for _, block in pool.swap_in}
    gpu = [(h, b) for h, b in pool.cached_pages() if b not in pending_blocks]
    # a prefix computed again on the GPU while the tier still held it (a hybrid's, without its snapshot):
    # the GPU's copy, the newer
    on_gpu = {h for h, _ in gpu}
    host = [(h, s) for h, s in pool.host.slots.items() if s not in pending_slots and h not in on_gpu]
    keep = pool.host.num_slots
    gpu = gpu[-keep:]
    host = host[max(0, len(host) - (keep - len(gpu))) :]
    host_rows = torch.tensor([s for _, s in host], dtype=torch.int64)
    gpu_rows = torch.tensor([b for _, b in gpu], dtype=torch.int64, device=runner.device)
    state_pool = llm.scheduler.state_pool
    snapshots = list(state_pool.snapshots.items()) if state_pool else []
    state_rows = torch.tensor([s for _, s in snapshots], dtype=torch.int64, device=runner.device)
    host_snaps = []
    if state_pool is not None and state_pool.host is not None:
        pending = {slot for _, slot in state_pool.swap_out}
        on_gpu = {h for h, _ in snapshots}
        host_snaps = [
            (h, s) for h, s in state_pool.host.slots.items() if s not in pending and h not in on_gpu
        ]
    host_state_rows = torch.tensor([s for _, s in host_snaps], dtype=torch.int64)
    host_states = [h for _, h in runner.host_states.pairs] if runner.host_states is not None else []

    def rows(tensor: torch.Tensor, index: torch.Tensor):
        # a slice of rows at a time, so the file never needs the whole cache twice in memory
        return lambda: (tensor[index[i : i + CHUNK_ROWS]].cpu() for i in range(0, len(index), CHUNK_ROWS))

    def chained(*parts):
        return lambda: (piece for part in parts for piece in part())

    n = len(host) + len(gpu)
    entries = [
        Entry(
            f"page.{i}",
            host_t.dtype,
            (n, *host_t.shape[1:]),
            chained(rows(host_t, host_rows), rows(dev_t, gpu_rows)),
        )
        for i, (dev_t, host_t) in enumerate(pairs)
    ]
    entries += [
        Entry(
            f"state.{j}",
            t.dtype,
            (len(host_snaps) + len(snapshots), *t.shape[1:]),
            chained(*([rows(host_states[j], host_state_rows)] if host_snaps else []), rows(t, state_rows)),
        )
        for j, t in enumerate(state_tensors(runner))
    ]
    metadata = {
        "format": FORMAT,
        "version": str(VERSION),
        "identity": json.dumps(identity(llm), sort_keys=True),
        "pages": ",".join(h.hex() for h, _ in [*host, *gpu]),
        "snapshots": ",".join(h.hex() for h, _ in [*host_snaps, *snapshots]),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    tmp = f"{path}.tmp"
    write(tmp, entries, metadata)
    os.replace(tmp, path)
    return len(host) + len(gpu), len(host_snaps) + len(snapshots)


def _metadata(path: Path) -> dict[str, str]:
    """The file's metadata; refused in a sentence when it is not a prefix-cache file."""
    from safetensors import safe_open

    overwrite = "it would be overwritten at shutdown; give --prefix-cache-file a path of its own"
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # safetensors raises its own errors for a file that is not one
        raise NinferError(
            f"--prefix-cache-file {path} is not a file ninfer wrote ({type(e).__name__}); {overwrite}"
        ) from None
    if meta.get("format") != FORMAT:
        raise NinferError(f"--prefix-cache-file {path} is not a ninfer prefix-cache file; {overwrite}")
    return meta


def check_file(path: str) -> None:
    """Refused before the model loads when `path` exists and is not a prefix-cache file."""
    if Path(path).exists():
        _metadata(Path(path))


@torch.inference_mode()
def load(llm, path: str) -> tuple[str, bool]:
    """Read the file into the host tier and the snapshot slots: (one line for the log saying what came in,
    whether the file was read)."""
    from safetensors import safe_open

    file = Path(path)
    if not file.exists():
        return f"prefix cache file {path}: not there yet (written at shutdown)", False
    meta = _metadata(file)
    if meta.get("version") != str(VERSION):
        return (
            f"prefix cache file {path}: version {meta.get('version')}, this ninfer reads {VERSION}; not read",
            False,
        )
    theirs, mine = json.loads(meta.get("identity", "{}")), json.loads(json.dumps(identity(llm)))
    differs = [key for key in mine if theirs.get(key) != mine[key]]
    if differs:
        return (
            f"prefix cache file {path} was written for another {', '.join(differs)}; not read (replaced at "
            "shutdown)",
            False,
        )
    pool, runner, state_pool = llm.scheduler.block_pool, llm.runner, llm.scheduler.state_pool
    hashes = [bytes.fromhex(h) for h in meta["pages"].split(",") if h]
    snap_hashes = [bytes.fromhex(h) for h in meta["snapshots"].split(",") if h]
    with safe_open(str(file), "pt") as f:
        names = set(f.keys())
        pages = [f"page.{i}" for i in range(len(runner.host_kv.pairs))]
        states = [f"state.{j}" for j in range(len(state_tensors(runner)))]

        def rows_of(name: str) -> int:
            return f.get_slice(name).get_shape()[0] if name in names else -1

        whole = all(rows_of(n) == len(hashes) for n in pages) and all(
            rows_of(n) == len(snap_hashes) for n in states
        )
        unique = len(set(hashes)) == len(hashes) and len(set(snap_hashes)) == len(snap_hashes)
        if not (whole and unique):
            return (
                f"prefix cache file {path} does not hold what its index names; not read (replaced at "
                "shutdown)",
                False,
            )
        first = max(0, len(hashes) - pool.host.num_slots)  # the newest that fit
        slots = [pool.host.put(h) for h in hashes[first:]]
        rows = torch.tensor(slots, dtype=torch.int64)
        for name, (_, host_t) in zip(pages, runner.host_kv.pairs):
            host_t[rows] = f.get_slice(name)[first:]
        # the newest snapshots into the GPU slots, those before them into the host tier
        room = state_pool.num_snapshots if state_pool is not None else 0
        host_room = state_pool.host.num_slots if state_pool is not None and state_pool.host is not None else 0
        snap_first = max(0, len(snap_hashes) - room)
        host_first = max(0, snap_first - host_room)
        snap_slots = [state_pool.new_snapshot(h) for h in snap_hashes[snap_first:]] if room else []
        host_slots = [state_pool.host.put(h) for h in snap_hashes[host_first:snap_first]]
        rows = torch.tensor(snap_slots, dtype=torch.int64, device=runner.device)
        host_rows = torch.tensor(host_slots, dtype=torch.int64)
        for j, (name, t) in enumerate(zip(states, state_tensors(runner))):
            t[rows] = f.get_slice(name)[snap_first:].to(runner.device)
            if host_slots:
                runner.host_states.pairs[j][1][host_rows] = f.get_slice(name)[host_first:snap_first]
    if state_pool is not None:
        state_pool.end_step()
    snaps = f" and {len(snap_slots) + len(host_slots)} state snapshots" if state_pool is not None else ""
    return (
        f"prefix cache file {path}: {len(slots):,} pages ({len(slots) * pool.block_size:,} tokens){snaps} "
        f"read into the host tier (written {meta.get('written', '?')})",
        True,
    )
