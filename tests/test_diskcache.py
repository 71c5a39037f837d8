"""The on-disk cache (npusim.diskcache): entries that cannot be trusted are recomputed,
writers never corrupt each other, the size cap evicts the least recently used, a
folder that cannot be written runs uncached, and a warm run writes what a cold one did."""

import enum
import errno
import json
import multiprocessing
import os
import tempfile

import attrs
import pytest

from npusim.cli import main
from npusim.diskcache import DiskCache, open_store
from npusim.diskcache.compute import cached
from npusim.hw import load_hw


def _writer(path: str, key: str, value, barrier) -> None:
    store = DiskCache(path)
    barrier.wait()
    for _ in range(20):
        store.put(key, value)


def test_two_processes_writing_the_same_entry(tmp_path):
    value = {"latency": 1.5, "blob": list(range(200_000))}  # a payload large enough to take a while to write
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), "k" * 64, value, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = DiskCache(tmp_path)
    assert store.get("k" * 64) == value
    assert store.dropped == 0
    assert sorted(os.listdir(tmp_path)) == ["k" * 64 + ".entry"]  # no temporary file left behind


def test_truncated_entry_is_recomputed(tmp_path):
    store = DiskCache(tmp_path)
    store.put("a" * 64, list(range(1000)))
    path = store.entry_path("a" * 64)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert store.get("a" * 64) is None
    assert store.dropped == 1 and not path.exists()  # never trusted, removed
    calls = []
    hw = load_hw()
    for _ in range(2):
        assert cached(store, "test", ("x",), hw, lambda hw: calls.append(1) or hw.l2.line_bytes) == 512
    assert len(calls) == 1


def test_flipped_byte_is_detected(tmp_path):
    store = DiskCache(tmp_path)
    store.put("b" * 64, "a value of some length")
    path = store.entry_path("b" * 64)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    assert store.get("b" * 64) is None and store.dropped == 1


def test_a_header_nested_past_the_json_parsers_depth_is_a_miss(tmp_path):
    """A header line of 1500 nested lists (within the 4096 bytes a header may have) was
    a RecursionError traceback from json.loads on every run that read the key."""
    store = DiskCache(tmp_path)
    store.put("d" * 64, "a value")
    path = store.entry_path("d" * 64)
    data = path.read_bytes()
    path.write_bytes(b"NPUSIM-CACHE " + b"[" * 1500 + b"]" * 1500 + data[data.index(b"\n"):])
    assert store.get("d" * 64) is None and store.dropped == 1 and not path.exists()


def test_entry_of_another_version_is_recomputed(tmp_path):
    DiskCache(tmp_path, version="0.0.1+someothersource").put("c" * 64, "old answer")
    store = DiskCache(tmp_path)
    assert store.get("c" * 64) is None and store.dropped == 1
    store.put("c" * 64, "new answer")
    assert store.get("c" * 64) == "new answer"


def test_results_are_keyed_on_the_model_version_not_the_source(tmp_path, monkeypatch):
    """A computed value survives an edit of npusim's source (its version names no source
    hash) and goes stale when MODEL_VERSION is bumped."""
    import npusim
    import npusim.model_version
    from npusim.diskcache import keys

    assert keys.version() == f"{npusim.__version__}+model{npusim.model_version.MODEL_VERSION}"
    calls = []

    def compute(hw):
        calls.append(1)
        return hw.l2.line_bytes

    hw = load_hw()
    assert cached(DiskCache(tmp_path), "test", ("x",), hw, compute) == 512
    monkeypatch.setattr(keys, "source_hash", lambda root: "an edited source")  # what an edit would change
    keys.source_version.cache_clear()
    assert cached(DiskCache(tmp_path), "test", ("x",), hw, compute) == 512 and len(calls) == 1
    monkeypatch.setattr(npusim.model_version, "MODEL_VERSION", npusim.model_version.MODEL_VERSION + 1)
    keys.version.cache_clear()
    try:
        store = DiskCache(tmp_path)
        assert cached(store, "test", ("x",), hw, compute) == 512 and len(calls) == 2
    finally:
        keys.version.cache_clear()
        keys.source_version.cache_clear()


def test_printed_outputs_follow_the_source(tmp_path, monkeypatch):
    """What `run` printed is the reports' text as much as the model's: its key follows a
    hash of every source file (the serving layer's too), not only MODEL_VERSION."""
    import argparse

    from npusim.diskcache import keys, replay

    for rel in ("engine/pipe.py", "engine/_l2.c", "serving/dynamic.py", "services/a.yaml", "report/text.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("one")
    before = keys.source_hash(tmp_path)
    for rel in ("engine/pipe.py", "engine/_l2.c", "serving/dynamic.py", "services/a.yaml", "report/text.py"):
        (tmp_path / rel).write_text("two")
        after = keys.source_hash(tmp_path)
        assert after != before, rel
        before = after
    args = argparse.Namespace(command="run", hw="ascend910b2", set=None, workload="k3-tiny", batch=2, context=64)
    first = replay._key(args)
    monkeypatch.setattr(keys, "source_version", lambda: "0+edited")
    assert first is not None and replay._key(args) != first


def test_entry_stored_under_another_key_is_not_served(tmp_path):
    store = DiskCache(tmp_path)
    store.put("d" * 64, "for d")
    os.replace(store.entry_path("d" * 64), store.entry_path("e" * 64))
    assert store.get("e" * 64) is None


def _read_only(monkeypatch, folder):
    """Make `folder` unwritable: its mode where that binds (not for root), and the
    OS's answer to creating a file in it in any case (EROFS, as a read-only mount)."""
    folder.chmod(0o555)
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):
        if dir is not None and os.path.realpath(dir) == os.path.realpath(folder):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_read_only_cache_runs_uncached_with_one_warning(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    DiskCache(folder).put("f" * 64, "stored before the folder became read-only")
    _read_only(monkeypatch, folder)
    try:
        monkeypatch.setenv("NPUSIM_CACHE_DIR", str(folder))
        argv = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64"]
        assert main(argv) == 0
        captured = capsys.readouterr()
        warnings = [line for line in captured.err.splitlines() if "warning" in line]
        assert len(warnings) == 1 and str(folder) in warnings[0] and "uncached" in warnings[0]
        assert "latency" in captured.out
        assert DiskCache(folder).get("f" * 64) is None  # a folder that cannot be written is not read either
    finally:
        folder.chmod(0o755)
    assert sorted(os.listdir(folder)) == ["f" * 64 + ".entry"]  # nothing written


def test_lru_eviction_under_the_cap(tmp_path):
    store = DiskCache(tmp_path, max_bytes=10**9)
    for i in range(4):
        store.put(f"{i:064d}", bytes(10_000))
        os.utime(store.entry_path(f"{i:064d}"), ns=(i * 10**9, i * 10**9))  # written in this order
    entry = store.entry_path(f"{0:064d}").stat().st_size
    assert store.get(f"{0:064d}") is not None  # a use: 0 becomes the most recently used
    store.max_bytes = 3 * entry
    store.put(f"{4:064d}", bytes(10_000))  # over the cap: the least recently used go, 1 and 2
    left = sorted(p.name[:64] for p in tmp_path.iterdir())
    assert left == [f"{i:064d}" for i in (0, 3, 4)]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= store.max_bytes


def test_no_cache_writes_nothing(tmp_path):
    store = open_store(tmp_path / "c", enabled=False)
    assert cached(store, "test", (), load_hw(), lambda hw: 7) == 7
    assert not (tmp_path / "c").exists()


def test_objects_stored_by_name_are_the_readers_own():
    from npusim.diskcache.store import dumps, loads

    hw, other = load_hw(), load_hw("ascend910b2", {"l2.ways": "8"})
    payload = dumps({"mine": hw, "l2": hw.l2, "other": other}, {"hw": hw, "hw.l2": hw.l2})
    reader = load_hw()
    assert reader == hw and reader is not hw
    back = loads(payload, {"hw": reader, "hw.l2": reader.l2})
    assert back["mine"] is reader and back["l2"] is reader.l2
    assert back["other"] == other and back["other"] is not other  # same type, not named: stored by value
    with pytest.raises(KeyError):  # the reader lacks a name the entry uses: a damaged entry, recomputed
        loads(payload, {"hw": reader})


def test_warm_run_is_bit_identical_and_served_from_the_cache(tmp_path, capsys, monkeypatch):
    from npusim.diskcache import replay

    argv = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--cache-dir", str(tmp_path / "cache"),
            "--json", str(tmp_path / "out.json")]
    outs = []
    for _ in range(3):
        assert main(argv) == 0
        outs.append(((tmp_path / "out.json").read_text(), capsys.readouterr().out))
        if len(outs) == 2:  # the command's outputs gone: the step is read back from its own entry
            monkeypatch.setattr(replay, "_key", lambda args: None)
    assert outs[0] == outs[1] == outs[2]
    store = DiskCache(tmp_path / "cache")
    assert len(store.entries()) == 3  # the command's outputs, the step, the list of config fields it read
    assert json.loads(outs[0][0])["latency_us"] > 0


def test_a_field_the_step_does_not_read_is_served_from_the_cache(tmp_path):
    from npusim.runtime.decoder import run_decoder

    store = DiskCache(tmp_path)
    args = dict(workload="k3-tiny", batch=2, context=64, passes="optimized", store=store)
    first = run_decoder(hw="ascend910b2", **args)
    assert len(store.entries()) == 2  # the step, and the list of config fields it read
    # the cost of an eager launch is not read in graph mode (the optimized pipeline's launch mode)
    same = run_decoder(hw="ascend910b2", overrides={"runtime.eager_launch_us": "99"}, **args)
    assert len(store.entries()) == 2 and same.latency_us == first.latency_us
    assert same.hw == load_hw("ascend910b2", {"runtime.eager_launch_us": "99"})  # the caller's config, not the first
    other = run_decoder(hw="ascend910b2", overrides={"runtime.graph_launch_us": "9"}, **args)
    assert len(store.entries()) == 3 and other.latency_us != first.latency_us  # a field it reads: simulated


def test_a_table_entry_the_step_does_not_read_is_served_from_the_cache(tmp_path):
    """A table field (vector costs per op) is read entry by entry: changing the cost of a
    vector op no kernel of the step issues is a cache hit, of one it issues a miss."""
    from npusim.runtime.decoder import run_decoder

    store = DiskCache(tmp_path)
    args = dict(workload="k3-tiny", batch=2, context=64, passes="optimized", store=store)
    first = run_decoder(hw="ascend910b2", **args)
    same = run_decoder(hw="ascend910b2", overrides={"aiv.vector_cycles_per_repeat.sort32": "9"}, **args)
    assert len(store.entries()) == 2 and same.latency_us == first.latency_us  # no sort in a decode step
    other = run_decoder(hw="ascend910b2", overrides={"aiv.vector_cycles_per_repeat.exp": "9"}, **args)
    assert len(store.entries()) == 3 and other.latency_us != first.latency_us


def test_a_warm_run_never_writes_its_json_over_an_input(tmp_path, capsys):
    hw = tmp_path / "hw.yaml"
    from npusim.hw.load import find_file

    hw.write_text(find_file("ascend910b2", "hwconfigs").read_text())
    argv = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--hw", str(hw)]
    assert main([*argv, "--json", str(tmp_path / "out.json")]) == 0
    before = hw.read_text()
    assert main([*argv, "--json", str(hw)]) == 2
    assert "the same file as the input of --hw" in capsys.readouterr().err
    assert hw.read_text() == before


def test_a_warm_run_names_the_json_it_wrote_not_the_first_runs(tmp_path, capsys, monkeypatch):
    """The line naming the JSON report is the command's own: a run served from the store
    prints the path it was given (the stored text leaves the first run's out)."""
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["op", "add", "shape=64,64"]
    outs = []
    for name in ("a.json", "b.json"):
        assert main([*argv, "--json", str(tmp_path / name)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0].splitlines()[-1] == f"wrote {tmp_path / 'a.json'}"
    assert outs[1].splitlines()[-1] == f"wrote {tmp_path / 'b.json'}"
    assert outs[0].splitlines()[:-1] == outs[1].splitlines()[:-1]
    assert main(argv) == 0 and "wrote" not in capsys.readouterr().out


def test_an_op_parameter_refused_now_is_refused_though_a_result_for_it_is_stored(tmp_path, capsys, monkeypatch):
    """npusim op checks its parameters before it asks the cache of simulated ops (keyed on
    the model version, which a new check does not bump): a check added after a result was
    stored refuses the value all the same. (--trace: past the replay of printed text,
    which is keyed on the source.)"""
    import npusim.ops.registry as registry
    from npusim.errors import ConfigError

    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["op", "scale", "shape=64,64", "scale=3", "--trace", str(tmp_path / "t.json")]
    assert main(argv) == 0 and main(argv) == 0  # stored, then served
    capsys.readouterr()

    def refuse(op_type, f, value):
        raise ConfigError(f"op {op_type}: parameter '{f.name}' refused by a newer check")

    monkeypatch.setattr(registry, "_coerce", refuse)
    assert main(argv) == 2 and "refused by a newer check" in capsys.readouterr().err


def test_fusion_rules_given_as_a_mapping_or_a_file_are_keyed_by_value(tmp_path):
    from npusim.runtime.decoder import run_decoder

    store = DiskCache(tmp_path / "cache")
    rules = {"qkv_proj": False, "flash_attention": False, "scale_add": False, "swiglu": False, "add_rms_norm": True}
    args = dict(workload="k3-tiny", batch=2, context=64, passes="fusion", store=store)
    a = run_decoder(fusion_rules=rules, **args)
    assert run_decoder(fusion_rules=dict(rules), **args).latency_us == a.latency_us
    path = tmp_path / "rules.yaml"
    path.write_text("".join(f"{k}: {str(v).lower()}\n" for k, v in rules.items()))
    b = run_decoder(fusion_rules=str(path), **args)
    path.write_text("".join(f"{k}: true\n" for k in rules))  # the same file name, other rules: simulated again
    c = run_decoder(fusion_rules=str(path), **args)
    assert b.latency_us == a.latency_us and c.latency_us != b.latency_us


def test_a_routing_trace_rewritten_is_simulated_again(tmp_path, capsys):
    """The trace file was keyed by its path only: rewritten, the first trace's step (and the
    command's printed text) was served from the cache, silently."""
    from npusim.runtime.decoder import run_decoder
    from npusim.workload import load_workload

    trace = tmp_path / "trace.json"
    spread, packed = [[[t % 8, (t + 1) % 8] for t in range(64)]], [[[0, 1]] * 64]
    trace.write_text(json.dumps(spread))  # there when the workload is loaded (the loader checks it is)
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace)})
    store = DiskCache(tmp_path / "cache")
    latency = {}
    for name, rows in (("spread", spread), ("packed", packed)):
        trace.write_text(json.dumps(rows))
        latency[name] = run_decoder(w, batch=64, context=16, store=store).latency_us
    assert latency["packed"] == run_decoder(w, batch=64, context=16).latency_us != latency["spread"]
    argv = ["run", "--workload", "k3-tiny-moe", "--workload-set", "routing=trace", "--workload-set",
            f"routing_trace={trace}", "--batch", "64", "--context", "16"]
    printed = {}
    for name, rows in (("spread", spread), ("packed", packed)):
        trace.write_text(json.dumps(rows))
        assert main([*argv, "--cache-dir", str(tmp_path / "cache2")]) == 0
        printed[name] = capsys.readouterr().out
    assert main([*argv, "--no-cache"]) == 0
    assert printed["packed"] == capsys.readouterr().out != printed["spread"]


@attrs.frozen
class Rec:
    """A record class as stored values hold them (test_a_record_that_gained_a_field_is_recomputed)."""

    latency_us: float
    kind: "Kind"


class Kind(enum.Enum):
    CUBE = 1
    VECTOR = 2


def test_a_record_that_gained_a_field_is_recomputed(tmp_path, monkeypatch):
    """Entries outlive edits that keep results (they are keyed on MODEL_VERSION), so one
    may hold a record class that has since gained or lost a field, or an enum whose
    members changed: it is a miss, recomputed, never read back half-filled. An edit that
    leaves the fields alone (a method, a docstring) keeps it."""
    import sys

    module = sys.modules[__name__]
    store = DiskCache(tmp_path)
    calls = []
    hw = load_hw()

    def compute(hw):
        calls.append(1)
        return [module.Rec(1.5, module.Kind.CUBE)]

    assert cached(store, "test", (), hw, compute) == [Rec(1.5, Kind.CUBE)]

    @attrs.frozen
    class Rec2:  # same fields, a method more: the entry is still read
        latency_us: float
        kind: Kind

        def doubled(self):
            return 2 * self.latency_us

    Rec2.__name__ = Rec2.__qualname__ = "Rec"
    monkeypatch.setattr(module, "Rec", Rec2)
    (hit,) = cached(DiskCache(tmp_path), "test", (), hw, compute)
    assert len(calls) == 1 and hit.doubled() == 3.0

    @attrs.frozen
    class Rec3:  # a field more
        latency_us: float
        kind: Kind
        bytes_moved: int = 0

    Rec3.__name__ = Rec3.__qualname__ = "Rec"
    monkeypatch.setattr(module, "Rec", Rec3)
    store = DiskCache(tmp_path)
    (value,) = cached(store, "test", (), hw, compute)
    assert len(calls) == 2 and store.dropped == 1 and value.bytes_moved == 0

    monkeypatch.setattr(module, "Kind", enum.Enum("Kind", {"CUBE": 2, "VECTOR": 1}))  # members renumbered
    store = DiskCache(tmp_path)
    (value,) = cached(store, "test", (), hw, compute)
    assert len(calls) == 3 and store.dropped == 1 and value.kind.name == "CUBE"


class Packed:
    """A value pickled through a function of its fields, in order (as runtime.run.GraphRun)."""

    def __init__(self, latency_us: float, kernels: int):
        self.latency_us, self.kernels = latency_us, kernels

    def __reduce__(self):
        return _unpack, (self.latency_us, self.kernels)


def _unpack(latency_us, kernels):
    return Packed(latency_us, kernels)


def test_a_value_whose_rebuilding_function_changed_is_recomputed(tmp_path, monkeypatch):
    import sys

    module = sys.modules[__name__]
    calls = []

    def compute(hw):
        calls.append(1)
        return Packed(2.5, 3)

    assert cached(DiskCache(tmp_path), "test", (), load_hw(), compute).kernels == 3
    def reordered(kernels, latency_us):
        return Packed(latency_us, kernels)

    reordered.__name__ = reordered.__qualname__ = "_unpack"
    monkeypatch.setattr(module, "_unpack", reordered)  # and the class's reduction with it
    monkeypatch.setattr(Packed, "__reduce__", lambda self: (reordered, (self.kernels, self.latency_us)))
    store = DiskCache(tmp_path)
    value = cached(store, "test", (), load_hw(), compute)
    assert len(calls) == 2 and store.dropped == 1 and (value.latency_us, value.kernels) == (2.5, 3)


# ------------------------------------------------------------------ hostile folders and entries


def test_clear_removes_only_what_the_store_wrote(tmp_path):
    """`npusim cache clear --cache-dir` of a folder that is not only npusim's: files named
    like entries but not headed as one (a user's), other files and temporary files of
    other programs stay."""
    store = DiskCache(tmp_path)
    store.put("c" * 64, "an entry")
    (tmp_path / ".leftover.entry.x1y2.tmp").write_bytes(b"NPUSIM-CACHE {half an entry")  # an interrupted write
    kept = {"notes.entry": b"my own notes", ".editor.swp.tmp": b"x", "data.csv": b"a,b", ".x.entry.z.tmp": b"mine"}
    for name, data in kept.items():
        (tmp_path / name).write_bytes(data)
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert [name for *_, name in store.entries()] == []  # a file not headed as an entry is not one


@pytest.mark.parametrize("kind", ["fifo", "device link", "another object"])
def test_a_hostile_entry_is_a_miss_and_the_run_goes_on(tmp_path, capsys, kind):
    """An entry that is a FIFO (would block a read), a link to /dev/zero (would be read
    without end), or a well-formed entry holding another object than the command
    stored: the run computes its result as on a cold cache."""
    from npusim.diskcache import replay

    cache = tmp_path / "cache"
    argv = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--cache-dir", str(cache)]
    assert main(argv) == 0
    cold = capsys.readouterr().out
    store = DiskCache(cache)
    (key,) = [name.removesuffix(".entry") for *_, name in store.entries()
              if replay._replayable(store.get(name.removesuffix(".entry")))]  # the command's stored output
    path = store.entry_path(key)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device link":
        path.symlink_to("/dev/zero")
    else:
        DiskCache(cache).put(key, ["not", "a", "run"])
    assert main(argv) == 0
    assert capsys.readouterr().out == cold


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another owner"])
def test_a_cache_folder_others_can_write_is_refused(tmp_path, capsys, monkeypatch, how):
    """Entries are pickles npusim loads: a folder someone else can write into (or owns) is
    not read or written; one warning line says why and how to fix it, the run goes on."""
    folder = tmp_path / "shared"
    DiskCache(folder).put("d" * 64, "written while the folder was private")
    assert folder.stat().st_mode & 0o777 == 0o700  # the store makes its folder private
    if how == "another owner":
        monkeypatch.setattr(os, "getuid", lambda: folder.stat().st_uid + 1)
    else:
        folder.chmod(0o770 if how == "group-writable" else 0o707)
    assert DiskCache(folder).get("d" * 64) is None
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--cache-dir", str(folder)]) == 0
    captured = capsys.readouterr()
    (warning,) = [line for line in captured.err.splitlines() if "warning" in line]
    assert str(folder) in warning and "uncached" in warning
    assert ("not you" if how == "another owner" else "chmod go-w") in warning
    assert sorted(os.listdir(folder)) == ["d" * 64 + ".entry"]  # nothing written


@pytest.mark.parametrize("text", ["0", "-5", "lots", "1_000", "１０００"])
def test_a_bad_cache_size_is_one_line(text, tmp_path, monkeypatch):
    """NPUSIM_CACHE_MAX_BYTES=1_000 (or full-width digits) was read by int() as 1000: a
    size spelt so is a slip, refused as a flag's number is."""
    from npusim.outputs import OutputError

    monkeypatch.setenv("NPUSIM_CACHE_MAX_BYTES", text)
    with pytest.raises(OutputError, match=rf"^NPUSIM_CACHE_MAX_BYTES: expected a positive integer \(bytes\), "
                                          rf"got '{text}'$"):
        DiskCache(tmp_path / "c")


@pytest.mark.parametrize("command", ["info", "clear"])
@pytest.mark.parametrize("where, reason", [
    ("file/sub", "{d}/file is a file, not a folder"),
    ("dangling", "a link to {d}/nowhere/x, which does not exist"),
    ("x" * 300, "the name xxxxxxxxxxxxxxxxxxxx... is 300 bytes (at most 255)"),
])
def test_cache_info_and_clear_on_a_path_no_folder_can_be_at(command, where, reason, tmp_path, capsys):
    """A folder under a file, or a link to nothing, said 'entries: 0' ('removed 0 files') as a
    cache not made yet does; a name too long for a folder said '/tmp/...: File name too long',
    the flag unnamed."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    assert main(["cache", command, "--cache-dir", str(tmp_path / where)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"npusim: error: cache {tmp_path / where}: {reason.format(d=tmp_path)} (give "
                                 f"--cache-dir or NPUSIM_CACHE_DIR the cache folder)\n")


@pytest.mark.parametrize("where, reason", [
    ("file", "a file, not a folder"),
    ("file/sub", "{d}/file is a file, not a folder"),
    ("dangling", "a link to {d}/nowhere/x, which does not exist"),
])
def test_a_cache_folder_that_is_no_folder_says_why(where, reason, tmp_path, capsys):
    """A file or a link to nothing in the folder's place: the warning said "(File exists)"."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    store = DiskCache(tmp_path / where)
    assert store.get("f" * 64) is None and not store.enabled
    warning = capsys.readouterr().err.strip()
    assert warning == f"npusim: warning: cache {tmp_path / where} not used ({reason.format(d=tmp_path)}); running " \
                      f"uncached"
