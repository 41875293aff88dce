"""The Triton interpreter's language patching, done once a launch instead of once a call (test speed only).

Under TRITON_INTERPRET=1 a launch patches triton.language's builtins for its duration (listing each module's
members with inspect.getmembers), and every call of a @triton.jit helper from inside the kernel
(_tile_product, _rotate_heads, ...) patches them again, though they are patched already and stay so until
the launch restores them. That second patching was ~30% of an interpreted engine test's time
(tests/engine/test_mtp.py: 18,467 helper calls in 1,192 launches). Here a call patches nothing where the
language modules its function sees are patched already (a helper inside a launch: the same module objects;
a helper seeing `tl.core` alone, as tl.zeros does, still patches that the first time, as upstream does),
and each module's builtins are listed once per process (the list is the modules' own, unpatched, at every
launch's start).
What the kernels compute is not touched. Applied only where this Triton's interpreter has the shape it was
written against; elsewhere the interpreter runs as it comes."""

from __future__ import annotations

import functools
import inspect


def install() -> bool:
    """Patch the interpreter if it is the expected one; whether it was."""
    try:
        from triton.runtime import interpreter as it
    except Exception:  # noqa: BLE001 - no interpreter in this Triton build: nothing to speed up
        return False
    needed = ("_patch_lang", "_patch_builtin", "_patch_attr", "tl")
    if not all(hasattr(it, name) for name in needed) or getattr(it, "_ninfer_patched", False):
        return False
    if list(inspect.signature(it._patch_builtin).parameters) != ["pkg", "builder", "scope"]:
        return False
    original_patch_lang = it._patch_lang

    @functools.cache
    def builtins_of(pkg) -> tuple:
        return tuple((n, m) for n, m in inspect.getmembers(pkg) if it.tl.core.is_builtin(m))

    def patch_builtin(pkg, builder, scope):
        for name, member in builtins_of(pkg):
            it._patch_attr(pkg, name, member, builder, scope)

    class _NothingToRestore:
        def restore(self) -> None:
            pass

    @functools.cache
    def langs_of(fn) -> tuple:
        """The language modules fn sees (triton.language, or its core: tl.zeros's module sees only that)."""
        return tuple(v for v in fn.__globals__.values() if v is it.tl or v is it.tl.core)

    def patch_lang(fn):
        # a module is patched while its builtins are the interpreter's wrappers (no __triton_builtin__ mark):
        # from a launch's patching until its restore, or, for a module only a helper sees (tl.core, from
        # tl.zeros), from that helper's first call on (the interpreter never restores a helper's patching)
        langs = langs_of(fn)
        if langs and not any(it.tl.core.is_builtin(lang.load) for lang in langs):
            return _NothingToRestore()
        return original_patch_lang(fn)

    it._patch_builtin = patch_builtin
    it._patch_lang = patch_lang
    it._ninfer_patched = True
    return True
