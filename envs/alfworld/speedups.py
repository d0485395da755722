"""TextWorld/fast-downward speed-ups for the ALFWorld engine (memoised PDDL translation and parsing) and the
pool of fast-downward library copies that are never unloaded (both explained below)."""
from __future__ import annotations

import copy
import functools
import hashlib
import os
import pickle
import sys
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------------------------------------
# Engine speed-ups
# ---------------------------------------------------------------------------------------------
#
# Measured on a 2-core CPU for an 18-receptacle kitchen, TextWorld's PDDL backend spends a new
# game's reset almost entirely in two places: fast-downward's PDDL->SAS translation (~0.4 s,
# done four times: normal and "optimized" translations, once in load() and again in reset())
# and parsing text with TatSu: the grammar document (~0.3 s per load) and, on every step, each
# admissible command's template and fact query (~0.1 s per step). All are pure functions of their
# text inputs, so they are memoised here (in memory, and on disk for the two slow per-game ones).
# Last, the text generator deep-copies its derivation context for every symbol; a one-level copy
# is equivalent (see _shallow_copy_context). The game logic itself is untouched.

_MEMO: dict[tuple[str, str], Any] = {}
_MEMO_SIZE = 128
_disk_cache_dir: Path | None = None  # set by the env that is about to load or reset a game


def set_disk_cache_dir(path: Path | None) -> None:
    """Where the memoised translations of the env about to load or reset a game are kept on disk."""
    global _disk_cache_dir
    _disk_cache_dir = path


def _cached(kind: str, text: str, compute: Any) -> Any:
    """compute() memoised by the hash of `text`, in this process and on disk (compressed pickles
    under <cache_dir>/<kind>/, written by this module only; a torn or stale file is recomputed)."""
    key = (kind, hashlib.sha1(text.encode()).hexdigest())
    if key in _MEMO:
        return _MEMO[key]
    disk = _disk_cache_dir / kind / f"{key[1]}.pkl" if _disk_cache_dir is not None else None
    value = None
    if disk is not None and disk.exists():
        try:
            value = pickle.loads(zlib.decompress(disk.read_bytes()))
        except (OSError, zlib.error, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            value = None
    if value is None:
        value = compute()
        if disk is not None:
            disk.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=disk.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                # Compressed: ~200 KB -> ~25 KB a game, for caches of thousands of games.
                f.write(zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, disk)  # write-then-rename: parallel workers never read half a file
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = value
    return value


def _memo_pddl2sas(original: Any) -> Any:
    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
        # The "optimized" translation only feeds fast-downward's re-planner (policy_commands /
        # walkthrough), which this env never requests; the unpruned translation describes the
        # same task, so one translation serves both.
        def translate() -> tuple[Any, str]:
            argv = list(sys.argv)  # fast-downward's translator overwrites sys.argv
            try:
                return original(domain, problem, verbose=verbose, optimize=False)
            finally:
                sys.argv[:] = argv

        return _cached("sas", f"{len(domain)}\0{domain}\0{problem}", translate)

    pddl2sas.comprl_memo = True  # type: ignore[attr-defined]
    return pddl2sas


def _forgetful(parse: Any) -> Any:
    """A textworld module's `_parse_and_convert` that leaves nothing behind in the module's tatsu
    parser (a module-level singleton). The parser keeps its last parse's furthest failure (tatsu
    raises and catches FailedParse while backtracking), whose traceback holds every frame up the
    stack at that moment: the env that called step/reset, its game and its fast-downward library
    copy, until the next parse. Memoised, parses are rare, so that env would stay alive."""
    parser = getattr(sys.modules.get(getattr(parse, "__module__", "") or ""), "_PARSER", None)
    reset = getattr(parser, "_initialize_caches", None)
    if reset is None:
        return parse

    @functools.wraps(parse)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return parse(*args, **kwargs)
        finally:
            reset()

    return run


def _memo_twl2_parse(original: Any) -> Any:
    """The game's grammar document (alfred.twl2 + goal text) -> (actions, grammar), read-only
    afterwards: GameLogic copies the rules into its own grammar and only reads the actions."""
    original = _forgetful(original)

    def parse_and_convert(text: str, rule_name: str = "", **kwargs: Any) -> Any:
        if rule_name != "pddlStart" or kwargs:
            return original(text, rule_name=rule_name, **kwargs)
        return _cached("twl2", text, lambda: original(text, rule_name=rule_name))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _memo_csg_parse(original: Any) -> Any:
    """A text-grammar string -> its symbols. Derivation mutates the symbols' contexts, so every
    caller gets a fresh copy of the cached parse."""
    original = _forgetful(original)
    cached = functools.lru_cache(maxsize=8192)(lambda text, rule_name, trace: original(text, rule_name=rule_name, trace=trace))

    def parse_and_convert(text: str, rule_name: str = "symbols", trace: bool = False, **kwargs: Any) -> Any:
        if kwargs:
            return original(text, rule_name=rule_name, trace=trace, **kwargs)
        return copy.deepcopy(cached(text, rule_name, bool(trace)))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _memo_query_parse(original: Any) -> Any:
    """A fact query ("atlocation(a:agent, l:location) & ...") -> its predicates, which are
    immutable values; each caller gets its own list."""
    original = _forgetful(original)
    cached = functools.lru_cache(maxsize=4096)(lambda text: tuple(original(text, rule_name="conjunctiveQuery")))

    def parse_and_convert(text: str, rule_name: str = "", **kwargs: Any) -> Any:
        if rule_name != "conjunctiveQuery" or kwargs:
            return original(text, rule_name=rule_name, **kwargs)
        return list(cached(text))

    parse_and_convert.comprl_memo = True  # type: ignore[attr-defined]
    return parse_and_convert


def _shallow_copy_context(context: dict[str, Any]) -> dict[str, Any]:
    """textgen.copy_context without its deep copies (~80% of a step's time). Derivation only
    adds keys to the `variables` and `mapping` dicts and reads the entities and variables in
    them, so copying the two dicts one level deep keeps every caller's context independent."""
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


_shallow_copy_context.comprl_memo = True  # type: ignore[attr-defined]


def _install_speedups() -> None:
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    for module, attr, wrap in ((fast_downward, "pddl2sas", _memo_pddl2sas),
                               (pddl_logic, "_parse_and_convert", _memo_twl2_parse),
                               (textgen, "_parse_and_convert", _memo_csg_parse),
                               (tw_logic, "_parse_and_convert", _memo_query_parse)):
        if not getattr(getattr(module, attr), "comprl_memo", False):
            setattr(module, attr, wrap(getattr(module, attr)))
    textgen.copy_context = _shallow_copy_context


# ---------------------------------------------------------------------------------------------
# fast-downward library copies
# ---------------------------------------------------------------------------------------------
#
# Every textworld PddlEnv loads a private copy of libdownward.so (fast_downward.load_lib copies
# the file to a temp dir and dlopens it), because the library keeps the game state in globals.
# The copies are NOT independent, though: options::RawRegistry::instance()::instance_ (a
# function-local static) is an STB_GNU_UNIQUE symbol, so the dynamic loader binds it in every
# copy to the first copy's object. Each new copy's static initialisers therefore append their
# plugin entries (std::function objects and `options::Any` holders whose vtables live in *that*
# copy) to the first copy's registry. fast_downward.close_lib dlcloses a copy and unmaps its
# code, leaving those entries dangling; the next dlopen of a copy appends to the registry, the
# vector reallocates, copies every entry through its vtable and jumps into unmapped memory:
# "Segmentation fault" inside load_lib (seen with several envs alive, then closed, then new
# ones made). Whether it crashes depends (most likely) on whether a later copy is mapped at the
# freed address: making and closing one env at a time happened to survive.
#
# So no copy is ever unloaded in this process: a closed env hands its copy back to a pool (its
# planner state freed with `cleanup()`), and the next env takes it instead of loading another.
# The process holds as many copies as it had envs alive at once, each loaded exactly once.


class _DownwardLibPool:
    """Loaded copies of fast-downward's library, reused across envs and never dlclosed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[Any] = []
        self._free_ids: set[int] = set()
        self.loaded = 0  # copies loaded in this process (they stay loaded)
        self._load: Any = None  # fast_downward's own load_lib

    def acquire(self) -> Any:
        with self._lock:
            if self._free:
                lib = self._free.pop()
                self._free_ids.discard(id(lib))
                return lib
            load = self._load
        lib = load()  # outside the lock: dlopen takes the loader's own lock
        with self._lock:
            self.loaded += 1
        return lib

    def release(self, lib: Any) -> None:
        """Take back a copy nobody uses any more; releasing one twice is a no-op."""
        with self._lock:
            if id(lib) in self._free_ids:
                return
            lib.cleanup()  # frees the game's state registry; load_sas starts afresh
            self._free.append(lib)
            self._free_ids.add(id(lib))

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


_LIB_POOL = _DownwardLibPool()


def _install_lib_pool() -> None:
    """Route every load_lib / close_lib in this process (textworld's PddlEnv calls
    `fast_downward.load_lib()`) through the pool, so no caller can unload a copy."""
    import fast_downward
    import fast_downward.interface as fd_interface

    with _LIB_POOL._lock:
        if _LIB_POOL._load is None:
            _LIB_POOL._load = fd_interface.load_lib
        for module in (fast_downward, fd_interface):
            module.load_lib = _LIB_POOL.acquire
            module.close_lib = _LIB_POOL.release
