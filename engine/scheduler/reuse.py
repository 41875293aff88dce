"""--cache-reuse (llama-server's): a new prompt's tokens past its cached prefix, taken from an earlier
sequence that holds them further along, in runs of at least `min_run` tokens.

An editor's completion requests (llama.vim, llama.vscode) send a window of the file around the cursor: when
the cursor moves down, the window's first lines go and the rest moves up, so the new prompt is the old one
with tokens dropped. Past the prefix both share (its full pages are cached; the tokens after them that
both have are taken whatever their number), the old sequence is scanned for the new prompt's next
tokens: where at least `min_run` of them follow in order, their pages' K/V are copied to the new positions
(keys rotated by the shift, engine/cache/kv_shift.py) and counted as computed; old tokens that match
nothing are skipped; the first new token found nowhere ends the reuse (the rest is computed). As in
llama-server, the copied K/V keep what the dropped tokens contributed to them: an approximation that
trades a little exactness for not recomputing the window.

The sources are the latest finished sequences (their prefix-cache pages: full pages still named in the
pool), newest first; one must share the new prompt's cached pages (the same context up to the scan).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from engine.cache.block_pool import BlockPool

NUM_SOURCES = 8  # finished sequences kept as sources


class ReuseSource(NamedTuple):
    cache_root: bytes  # the prefix-cache root its pages hash from (the base model's or a LoRA adapter's)
    tokens: list[int]  # the tokens of its named pages
    hashes: list[bytes]  # those pages' hashes


class ReusePlan(NamedTuple):
    num_tokens: int  # new prompt tokens taken, right after its cached prefix
    copies: list[tuple[int, int, int]]  # (source slot, new position, shift) per token
    source_blocks: list[int]  # the source pages read (held for the step)


class CacheReuse:
    def __init__(self, min_run: int, block_pool: BlockPool):
        self.min_run, self.block_pool = min_run, block_pool
        self.sources: deque[ReuseSource] = deque(maxlen=NUM_SOURCES)

    def remember(self, cache_root: bytes, tokens: list[int], hashes: list[bytes]) -> None:
        """A finished sequence's named pages (its tokens, their hashes) as a source for later prompts."""
        if hashes:
            self.sources.appendleft(ReuseSource(cache_root, tokens, hashes))

    def plan(
        self, cache_root: bytes, hashes: list[bytes], num_hit_pages: int, tokens: list[int]
    ) -> ReusePlan | None:
        """The longest reuse any source offers a prompt whose first `num_hit_pages` pages (of `hashes`) are
        cached; `tokens`: the prompt's tokens from there up to the one it must compute (its last). None
        when no source offers a run of `min_run`."""
        if len(tokens) < self.min_run:
            return None
        best: ReusePlan | None = None
        for source in self.sources:
            if source.cache_root != cache_root or len(source.hashes) <= num_hit_pages:
                continue
            if source.hashes[:num_hit_pages] != hashes[:num_hit_pages]:
                continue
            plan = self._plan_from(source, num_hit_pages, tokens)
            if plan is not None and (best is None or plan.num_tokens > best.num_tokens):
                best = plan
        return best

    def _plan_from(self, source: ReuseSource, num_hit_pages: int, tokens: list[int]) -> ReusePlan | None:
        bs = self.block_pool.block_size
        start = num_hit_pages * bs
        limit = len(source.tokens)
        taken = 0  # of `tokens`: first those both have at the same positions, past the cached pages
        while start + taken < limit and taken < len(tokens) and source.tokens[start + taken] == tokens[taken]:
            taken += 1
        runs = [(start, start, taken)] if taken else []  # (old position, new position, length)
        old = start + taken
        while old < limit and taken < len(tokens):
            try:  # the next old position holding the new prompt's next token
                old = source.tokens.index(tokens[taken], old, limit)
            except ValueError:
                break
            n = 1
            while old + n < limit and taken + n < len(tokens) and source.tokens[old + n] == tokens[taken + n]:
                n += 1
            if n < self.min_run:
                old += 1
                continue
            runs.append((old, start + taken, n))
            old, taken = old + n, taken + n
        copies, blocks = [], []
        for old, new, n in runs:
            for i in range(n):
                page = (old + i) // bs
                block = self.block_pool.cached.get(source.hashes[page])
                if block is None:  # evicted since: the reuse ends here
                    return _plan(copies, blocks, self.min_run)
                if not blocks or blocks[-1] != block:
                    blocks.append(block)
                copies.append((block * bs + (old + i) % bs, new + i, new - old))
        return _plan(copies, blocks, self.min_run)


def _plan(copies: list[tuple[int, int, int]], blocks: list[int], min_run: int) -> ReusePlan | None:
    if len(copies) < min_run:
        return None
    return ReusePlan(len(copies), copies, list(dict.fromkeys(blocks)))
