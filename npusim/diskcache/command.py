"""`npusim cache info | clear`, and the cache flags of the commands that use the cache."""

from __future__ import annotations

from npusim.errors import ConfigError
from npusim.outputs import say


def add_cache_flags(p) -> None:
    """--cache-dir and --no-cache (run, compare, sweep, op, serve)."""
    p.add_argument("--cache-dir", metavar="DIR", help="where simulated steps and kernels persist "
                   "(default: $NPUSIM_CACHE_DIR, else the user's cache folder, e.g. ~/.cache/npusim)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")


def store_of(args):
    """The store the flags ask for (an off one with --no-cache)."""
    from npusim.diskcache import open_store

    return open_store(args.cache_dir, enabled=not args.no_cache)


def _cmd_cache(args) -> int:
    from npusim.diskcache import open_store
    from npusim.diskcache.keys import version
    from npusim.diskcache.store import folder_problem
    from npusim.runtime.memory import size as _size

    store = open_store(args.cache_dir)
    problem = folder_problem(store.path)  # not "0 entries", nor an OSError's words without the flag
    if problem:
        problem = "not a folder" if problem == "a file, not a folder" else problem
        raise ConfigError(f"cache {store.path}: {problem} (give --cache-dir or NPUSIM_CACHE_DIR the cache folder)")
    if args.cache_command == "clear":
        n, freed = store.clear()
        say(f"cache {store.path}: removed {n} files ({_size(freed)})")
        return 0
    entries = store.entries()
    total = sum(size for _, size, _ in entries)
    say(f"cache {store.path}\n  entries: {len(entries)}\n  size: {_size(total)} of {_size(store.max_bytes)} "
        f"(least recently used entries go beyond that; NPUSIM_CACHE_MAX_BYTES sets it)\n"
        f"  npusim version: {version()} (the model version: simulated results of another are recomputed; "
        f"printed outputs follow the source)")
    return 0


def add_cache_command(sub) -> None:
    """The `cache` subcommand."""
    p = sub.add_parser("cache", help="the cache of simulated steps and kernels: info, clear")
    p.add_argument("cache_command", choices=("info", "clear"), help="info: where, how many entries, how big; "
                   "clear: remove every entry")
    p.add_argument("--cache-dir", metavar="DIR", help="the cache folder (default: $NPUSIM_CACHE_DIR, else the "
                   "user's cache folder)")
    p.set_defaults(func=_cmd_cache)


__all__ = ["add_cache_command", "add_cache_flags", "store_of"]
