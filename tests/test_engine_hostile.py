"""The C engine (npusim/engine/_*.c) against hostile use: ids and sizes beyond what it
states it holds, arithmetic that would wrap, its private types used before __init__,
and an abandoned run's cycles. Each ends in one clean error (or is freed), never in a
crash, a hang, a wrapped number or a leak. A call that crashed or hung before its fix
runs in a fresh interpreter, so that it fails its test rather than ending pytest."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import textwrap
import weakref

import pytest
from kernels import M, V, mix_kernel, pipeline_kernel, simulate_on_device

from npusim.engine import pipe
from npusim.engine._l2 import burst_cost
from npusim.engine._pipe import Code, Walker
from npusim.engine.events import Environment, Signal
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.hw.config import FLAG_IDS_MAX, UNIT_BYTES_MAX
from npusim.isa import CrossSetFlag, CrossWaitFlag, Mmad, VecOp

HW = load_hw("ascend910b2")

# _pipe.c's entry kinds (compile.code_of numbers them alike)
K_SET, K_LOOP, K_CROSS_SET = 2, 4, 7


def isolated(code: str) -> str:
    """What `code` prints in a fresh interpreter; a crash or hang there fails the test."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text, repr(text)
    return text


# ------------------------------------------------------------------ flags (_pipe.c)


def test_sync_flag_ids_beyond_the_most_is_one_config_error():
    for n in (FLAG_IDS_MAX + 1, 10**18):
        with pytest.raises(ConfigError) as e:
            load_hw("ascend910b2", overrides={"sync.flag_ids": n})
        assert f"key 'sync.flag_ids': expected a value <= {FLAG_IDS_MAX}, got {n}" in one_line(e.value)


def test_a_cross_core_flag_id_beyond_the_most_is_refused_by_the_walk():
    """The id of the issue (2^57 + 2, once sync.flag_ids allowed it) indexed past the
    core's flags; a SetFlag number past what a core keeps would have asked for 2^40 x 64
    bytes: each is a ValueError naming it, when the Code is built."""
    for kind, number, named in ((K_CROSS_SET, 2**57 + 2, "cross-core flag id 144115188075855874"),
                                (K_CROSS_SET, FLAG_IDS_MAX, f"cross-core flag id {FLAG_IDS_MAX}"),
                                (K_CROSS_SET, 2**70, "cross-core flag id 1180591620717411303424"),
                                (K_SET, 1 << 40, "flag number 1099511627776"),
                                (K_SET, -1, "flag number -1")):
        with pytest.raises(ValueError) as e:
            Code(((kind, None, "flag", number),), 0)
        assert named in one_line(e.value) and "outside [0, " in str(e.value)


def cross_kernel(hw, flag: int):
    """A mixed kernel whose AIVs tell the AIC with cross-core flag `flag`."""
    aic, aiv = [CrossWaitFlag(M, flag), Mmad(16, 16, 16)], [VecOp("exp", 4096, dst=0), CrossSetFlag(V, flag)]
    return mix_kernel(hw, aic, aiv)


def test_the_highest_cross_core_flag_id_runs():
    """At the most flag ids the config allows, the highest id is a flag like any other."""
    hw = load_hw("ascend910b2", overrides={"sync.flag_ids": FLAG_IDS_MAX})
    spans = [simulate_on_device(cross_kernel(hw, flag), hw).trace.intervals for flag in (0, FLAG_IDS_MAX - 1)]
    assert spans[0] == spans[1] and any(iv[2] == "Mmad" for iv in spans[0])


def test_a_cross_core_flag_a_core_cannot_keep_is_a_value_error_not_a_memory_error(monkeypatch):
    """A core keeps a cross-core flag at id x AIVs per AIC + source: with 2^40 AIVs per
    AIC (a Walker built so; the config's checks stop it before) flag 1 is far past what
    a core keeps - it asked for 64 TiB before (MemoryError); now a ValueError naming it."""

    def walker(*args):
        cross = args[22]
        return Walker(*args[:22], (*cross[:4], 1 << 40, cross[5]), *args[23:])

    monkeypatch.setattr(pipe, "Walker", walker)
    with pytest.raises(ValueError) as e:
        simulate_on_device(cross_kernel(HW, 1), HW)
    assert "cross-core flag id 1 from source" in one_line(e.value) and "1099511627776 AIVs per AIC" in str(e.value)


# ------------------------------------------------------------------ bursts and lines (_l2.c)


def test_a_line_or_burst_beyond_the_most_is_one_config_error():
    for over, key in (({"l2.line_bytes": 2**59, "dma.burst_bytes": 2**59, "l2.ways": 1, "l2.l2_bytes": 2**59},
                       "l2.line_bytes"), ({"dma.burst_bytes": 2 * UNIT_BYTES_MAX}, "dma.burst_bytes")):
        with pytest.raises(ConfigError) as e:
            load_hw("ascend910b2", overrides=over)
        assert f"key '{key}': expected a value <= {UNIT_BYTES_MAX}" in one_line(e.value)


def test_the_burst_rounding_refuses_rather_than_wraps():
    """2^59-byte bursts gave a negative cost (the sum wrapped); now the C refuses a burst
    beyond its stated most, and a count beyond 2^63 is an OverflowError - where it fits,
    the Python rule's number."""
    from memory_reference import burst_cost as rule

    with pytest.raises(ValueError) as e:
        burst_cost(0, 2**59, 20, 2**59, 2**59)
    assert f"a burst of {2**59} bytes, expected 1 to {UNIT_BYTES_MAX}" in one_line(e.value)
    for args in ((0, 2**61, 4, 2**61, 64),  # 2^63 bytes moved
                 (0, 1, 2**62, 2**62, 2),  # 2^62 segments of one burst each: 2^63
                 (2**62, 2**62, 1, 0, 64),  # a segment ending at 2^63
                 (-(2**62), 1, 3, -(2**62) - 1, 64)):  # the third segment starting below -2^63
        assert rule(*args)[0] >= 2**63 or args[0] + args[1] + (args[2] - 1) * args[3] not in range(-2**63, 2**63)
        with pytest.raises(OverflowError) as e:
            burst_cost(*args)
        assert "burst_cost:" in one_line(e.value) and "beyond 2^63" in str(e.value)
    for args in ((3, 2**40, 7, 2**41 + 5, 64), (-(2**50), 2**45, 2**12, -(2**40) - 3, 2**20), (5, 100, 2**40, 96, 64)):
        assert burst_cost(*args) == rule(*args)


def test_a_mover_refuses_a_line_or_burst_beyond_the_most():
    from npusim.engine._l2 import Mover
    from npusim.engine.memory import MemorySystem

    mem = MemorySystem(Environment(), HW, record=False)
    for line, burst, what in ((2**59, 64, f"a line of {2**59} bytes"), (512, 2**59, f"a burst of {2**59} bytes"),
                              (512, 0, "a burst of 0 bytes")):
        with pytest.raises(ValueError) as e:
            Mover(mem.l2._core, line, burst, {}, mem._lines_of, None, [], None, None, Signal, None, None)
        assert what in one_line(e.value)


# ------------------------------------------------------------------ an access's own fill (_l2.c)


def test_a_line_repeated_across_pieces_reads_its_own_fill_as_arrived():
    """A 5-line access on 4 sets comes in two pieces; the second hits the line the first
    placed with this access's fill id (2^24: far past the 1024 the core starts with) while
    another fill is in flight. Its flag was read before it was grown (a crash); it is
    1 - arrived: an access never waits for its own fill."""
    out = isolated("""
        from array import array
        from npusim.engine._l2 import Core
        sets, ways = 4, 16
        arrays = [array('i', [-1] * sets * ways), array('i', [0] * sets * ways), bytearray(sets * ways),
                  array('i', [0] * sets * ways)]
        core = Core(*map(memoryview, arrays), sets, ways, 40503)
        lines = lambda *xs: memoryview(array('q', xs))
        print(core.access(lines(0), False, 1, False))  # fill 1 in flight
        print(core.access(lines(100, 101, 102, 103, 100), False, 1 << 24, False), core.in_flight)
    """)
    assert out.splitlines() == ["(0, None, [], None, True)", "(1, None, [], None, True) 2"]


def test_a_fill_id_the_core_never_issued_is_refused():
    """The fill array is the caller's (numpy's, for L2Cache): a slot holding a fill id
    past the core's flags is a ValueError, not a read past them (a crash)."""
    out = isolated("""
        from array import array
        from npusim.engine._l2 import Core
        arrays = [array('i', [-1] * 64), array('i', [0] * 64), bytearray(64), array('i', [0] * 64)]
        core = Core(*map(memoryview, arrays), 4, 16, 40503)
        lines = lambda *xs: memoryview(array('q', xs))
        core.access(lines(0, 1, 2, 3), False, 1, False)  # fill 1 in flight
        arrays[3][array('q', core.find(lines(0)))[0]] = 1 << 30
        try:
            core.access(lines(0), False, 0, False)
        except ValueError as e:
            print(e)
    """)
    assert out.startswith("L2 core: slot ") and out.endswith(" holds fill 1073741824, one never issued\n"), out


# ------------------------------------------------------------------ use before __init__

LINES = "memoryview(__import__('array').array('q', [0]))"
BEFORE_INIT = {  # made by __new__ alone (a type's __init__ never ran)
    "Core.access": f"new(_l2.Core).access({LINES}, False, 0, False)",  # looped forever (no sets)
    "Core.find": f"new(_l2.Core).find({LINES})",  # answered "not cached" from no arrays
    "Core.arrived": "new(_l2.Core).arrived(1)",
    "Mover.transfer": "new(_l2.Mover).transfer([0], 64, 1, 64, False, 1.0, print)",
    "Walker.flush": "new(_pipe.Walker).flush({}, (), 1)",  # read its Code's buffers through NULL
    "Walker.start": "new(_pipe.Walker).start()",
    "Walker.local": "new(_pipe.Walker).local",  # (fast-forward's marks) read the buffers through NULL
    "Walker.resume": "new(_pipe.Walker).resume(None)",
    "Walker()": "new(_pipe.Walker)()",
    "Flows.start": "new(_flows.Flows).start(64, 1.0, print)",
}


@pytest.mark.parametrize("call", BEFORE_INIT.values(), ids=BEFORE_INIT.keys())
def test_a_private_type_used_before_init_refuses(call):
    out = isolated(f"""
        from npusim.engine import _flows, _l2, _pipe
        new = lambda t: t.__new__(t)
        try:
            {call}
        except TypeError as e:
            print(e)
    """)
    assert "not initialised" in out and out.count("\n") == 1, out


def test_a_core_whose_init_failed_refuses():
    """A Core initialised, then initialised again with a bad size: it has released its
    old arrays, so it is not initialised any more (it kept walking them before)."""
    out = isolated("""
        from array import array
        from npusim.engine._l2 import Core
        arrays = [memoryview(array(t, [0] * 16)) for t in "iiBi"]
        core = Core(*arrays, 1, 16, 0)
        try:
            core.__init__(*arrays, 0, 16, 0)
        except ValueError as e:
            print(e)
        try:
            core.find(memoryview(array("q", [0])))
        except TypeError as e:
            print(e)
    """)
    assert out.splitlines()[0] == "L2 core: 0 sets of 16 ways, expected each 1 to 2^31 - 1"
    assert out.splitlines()[1].startswith("L2 core: not initialised")


def test_a_code_not_initialised_is_refused_as_a_loop_body_and_by_a_walker(monkeypatch):
    """A Code made by __new__ alone, or whose __init__ failed half way, walks as an
    empty stream (or a broken one): a loop and a Walker refuse it."""
    half = Code.__new__(Code)
    with pytest.raises(ValueError):
        half.__init__(((K_SET, None, "set", 0), (K_SET, None, "set", -1)), 0)
    for body in (Code.__new__(Code), half):
        with pytest.raises(TypeError) as e:
            Code(((K_LOOP, None, "", "i", 2, body),), 0)
        assert "a loop's body is not initialised" in one_line(e.value)
    made = []
    monkeypatch.setattr(pipe, "Walker", lambda *args: made.append(args) or Walker(*args))
    simulate_on_device(cross_kernel(HW, 0), HW)
    with pytest.raises(TypeError) as e:
        Walker(Code.__new__(Code), *made[0][1:])
    assert "its Code is not initialised" in one_line(e.value)
    with pytest.raises(ValueError) as e:
        Walker(made[0][0], *made[0][1:17], 0, *made[0][18:])  # a run's weight of no blocks
    assert "weight of 0 blocks" in one_line(e.value)


# ------------------------------------------------------------------ the event queue (_queue.c)


def test_an_environment_left_with_events_is_freed():
    """The queue's events hold the environment that holds the queue: the garbage
    collector must see the cycle (1.5-2 MiB per abandoned run before)."""
    env = Environment()
    Signal(env).fire()  # queued; it holds env

    def waits(env):
        yield Signal(env)

    env.process(waits(env))  # a process too: its start is queued, its generator holds env
    gone = weakref.ref(env)
    del env
    gc.collect()
    assert gone() is None


def test_the_attempts_a_divergence_abandons_are_freed():
    """engine.run abandons an attempt whose group came apart (test_engine_regression's
    case): its environment, with the events it had left, is freed."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.ops import lower

    hw = load_hw("ascend910b2", overrides={"l2.l2_bytes": 3 << 20})
    params = dict(heads=8, kv_heads=8, head_dim=64, seq_q=512, seq_kv=512, causal=True)
    calls = [Launch(k, 0, "graph") for k in lower("attention_unfused", params, hw).kernels] + [Synchronize()]
    envs = []
    run(calls, hw, "kernel", on_device=lambda device: envs.append(weakref.ref(device.env)))
    gc.collect()
    assert len(envs) > 1 and all(env() is None for env in envs)


def test_a_mark_that_fails_ends_the_run_with_its_error(monkeypatch):
    """A pipe's on_mark (fast-forward's marks, pipe.mark) that raises ends the run with that
    error, not a crash; with no mark_var the engine never calls it."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.engine.fastforward_rewrite import repeat_path
    from npusim.ops import lower

    kernel = lower("add", {"shape": "16384,1024"}, HW).kernels[0]
    var = repeat_path(kernel.program(kernel.core_type, 0).body)[1].var

    def refuse(*args):
        raise RuntimeError("mark refused")

    monkeypatch.setattr(pipe, "mark", refuse)
    calls = [Launch(kernel, 0), Synchronize()]
    with pytest.raises(RuntimeError, match="^mark refused$"):
        run(calls, HW, "kernel", on_device=lambda d: setattr(d, "mark_var", var))
    assert run(calls, HW, "kernel").cycles > 0


# ------------------------------------------------------------------ the flow model (_flows.c)


def flows_link(capacity=100.0, whole=None, at_delay_fn=None, samples=None):
    from npusim.engine._flows import Flows
    from npusim.engine.cycles import whole_cycles
    from npusim.engine.events import at_delay

    env = Environment()
    return env, Flows(capacity, samples, whole or whole_cycles, env, at_delay_fn or at_delay)


@pytest.mark.parametrize("args, named", [
    ((100, 0.0), "cap 0.0"),  # never ended (rate 0), the link's count kept it
    ((100, -1.0), "cap -1.0"),  # ended at once
    ((100, float("nan")), "cap nan"),  # a class of its own per flow, ended after a cycle
    ((float("nan"), 10.0), "nbytes nan"),  # never ended
    ((float("inf"), 10.0), "nbytes inf"),  # never ended
    ((-5, 10.0), "nbytes -5"),  # ended at once
    ((100, 10.0, 0), "weight 0"),  # counted as no flow: never ended
    ((100, 10.0, -1), "weight -1"),  # ended at once, the link's count below 0
])
def test_a_flow_that_could_never_end_or_would_end_at_once_is_refused(args, named):
    env, flows = flows_link()
    with pytest.raises(ValueError) as e:
        flows.start(*args[:2], print, *args[2:])
    assert f"Flows.start: {named}" in one_line(e.value)
    assert flows.active == 0
    env.run()


def test_weights_whose_sum_leaves_int64_are_refused():
    """Three flows of weight 2^62: the link's count wrapped (undefined in C) and they all
    ended at cycle 0. Now the flows in flight count to at most 2^63 - 1."""
    env, flows = flows_link()
    flows.start(100, 10.0, print, 2**62)
    flows.start(100, 10.0, print, 2**62 - 1)
    assert flows.active == 2**63 - 1
    with pytest.raises(ValueError) as e:
        flows.start(100, 10.0, print, 1)
    assert "weight 1, expected 1 or more flows (and with those in flight at most 2^63 - 1)" in one_line(e.value)
    assert flows.active == 2**63 - 1


def test_a_link_that_moves_nothing_refuses_a_flow_and_a_nan_or_negative_one_is_not_made():
    env, flows = flows_link(0.0)  # a link may be made at 0 (an absent NIC); a flow on it never ended
    with pytest.raises(ValueError) as e:
        flows.start(100, 10.0, print)
    assert "moves 0 bytes per cycle" in one_line(e.value)
    for capacity in (float("nan"), -1.0):
        with pytest.raises(ValueError) as e:
            flows_link(capacity)
        assert f"Flows: capacity {capacity}" in one_line(e.value)
    with pytest.raises(TypeError) as e:  # a SystemError at its first flow before
        flows_link(samples=())
    assert "samples must be a list or None, got tuple" in one_line(e.value)


def test_a_start_from_inside_whole_cycles_is_refused():
    """A link's timer walks its cap classes and calls whole_cycles on the way; a flow
    started from there (with a new cap) moved the classes under it (a use after free)."""
    started = []

    def whole(x):
        if not started:
            started.append(1)
            flows.start(5, 3.0, print)
        return math.ceil(round(x, 6))

    env, flows = flows_link(1.0, whole)
    flows.start(10, math.inf, print)  # ends at 20; the other's rest ends at 40.0000004,
    flows.start(20.0000002, math.inf, print)  # which only whole_cycles can round
    with pytest.raises(RuntimeError) as e:
        env.run()
    assert one_line(e.value) == "Flows: start called from inside its whole_cycles"


def test_a_timer_that_could_not_be_set_is_set_by_the_next_start(monkeypatch):
    """at_delay raising left the link believing its timer was set: no flow on it ever
    ended. Now the next start sets it, as the Python statement of the model does."""
    import flows_reference

    from npusim.engine import flows as flows_module
    from npusim.engine.events import at_delay

    def run(link_type):
        calls = []

        def failing_once(*args):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("no timer")
            return at_delay(*args)

        with monkeypatch.context() as m:
            m.setattr(flows_module, "at_delay", failing_once)
            m.setattr(flows_reference, "at_delay", failing_once)
            env = Environment()
            link = link_type(env, "L", 100.0)
            ends = []
            with pytest.raises(RuntimeError, match="^no timer$"):
                link.add(1000, 30.0, lambda: ends.append(("a", env.now)))
            link.add(5000, 64.0, lambda: ends.append(("b", env.now)))  # the first still ends first
            env.run()
        return ends, link.active, link.samples

    c, reference = run(flows_module.Link), run(flows_reference.ReferenceLink)
    assert c == reference and c[1] == 0 and len(c[0]) == 2


# ------------------------------------------------------------------ the walker's own calls (_pipe.c)


def test_a_mark_that_resumes_its_walker_is_refused(monkeypatch):
    """on_mark is called from inside the walk, between two of its frames: resuming the
    walker from there walked the stream on from under the frame the outer walk still
    held (a frame read after the stack moved, the pipe's entries walked twice)."""
    out = isolated("""
        from npusim.engine import Launch, Synchronize, pipe, run
        from npusim.engine.fastforward_rewrite import repeat_path
        from npusim.hw import load_hw
        from npusim.ops import lower

        hw = load_hw("ascend910b2")
        kernel = lower("add", {"shape": "16384,1024"}, hw).kernels[0]
        var = repeat_path(kernel.program(kernel.core_type, 0).body)[1].var
        pipe.mark = lambda kr, marks, walk: walk.resume(None)
        try:
            run([Launch(kernel, 0), Synchronize()], hw, "kernel", on_device=lambda d: setattr(d, "mark_var", var))
        except RuntimeError as e:
            print(e)
    """)
    assert out == "pipe Walker: resumed from inside its own walk (a callback it called)\n", out


def test_a_walker_resumed_after_its_end_is_refused(monkeypatch):
    """A pipe that has ended, resumed again, ended again: its counters went into its
    kernel's twice (busy and wait cycles, flops) and its end Signal fired twice."""
    from npusim.engine import Launch, Synchronize, run

    walkers, ends = [], []
    end = pipe.end
    monkeypatch.setattr(pipe, "Walker", lambda *args: walkers.append(Walker(*args)) or walkers[-1])
    monkeypatch.setattr(pipe, "end", lambda *args: ends.append(args[-1]) or end(*args))
    run([Launch(cross_kernel(HW, 0), 0), Synchronize()], HW, "kernel")
    assert len(ends) == len(walkers) > 1
    for walk in walkers:
        with pytest.raises(RuntimeError) as e:
            walk.resume(None)
        assert one_line(e.value) == "pipe Walker: resumed after the pipe has ended"
        with pytest.raises(RuntimeError) as e:
            walk()
        assert one_line(e.value) == "pipe Walker: called after the pipe has ended"
    assert len(ends) == len(walkers)


# ------------------------------------------------------------------ lists changed while read (_pipe.c, _l2.c)

EVIL_INDEX = """
        class Evil:  # an int by __index__, which empties the list it is read from
            def __init__(self, items):
                self.items = items

            def __index__(self):
                self.items.clear()
                return 64
"""


def test_a_block_offset_that_empties_the_offsets_is_refused():
    """A walk reads its run's block offsets, converting each; one converted by an __index__
    that empties the list made the next read past its end (a crash)."""
    out = isolated(EVIL_INDEX + """
        from npusim.engine import Launch, Synchronize, pipe, run
        from npusim.hw import load_hw
        from npusim.ops import lower

        walker = pipe.Walker

        def evil_offsets(*args):
            offsets = [0, 0]
            offsets[0] = Evil(offsets)
            return walker(*args[:16], offsets, *args[17:])

        pipe.Walker = evil_offsets
        hw = load_hw("ascend910b2")
        try:
            run([Launch(lower("add", {"shape": "64,1024"}, hw).kernels[0], 0), Synchronize()], hw, "kernel")
        except RuntimeError as e:
            print(e)
    """)
    assert out == "pipe walk: the run's block offsets changed while a copy read them\n", out


def test_a_member_address_that_empties_the_addresses_is_refused():
    """Likewise a transfer's member addresses (a crash), and a Core re-initialised (and
    failed) by the line pattern's callback (the walk looped forever over no sets)."""
    out = isolated(EVIL_INDEX + """
        from array import array
        from npusim.engine._l2 import Core, Mover
        from npusim.engine.events import Environment, Signal
        from npusim.engine.memory import MemorySystem
        from npusim.hw import load_hw

        mem = MemorySystem(Environment(), load_hw("ascend910b2"), record=False)
        addrs = [0, None, 7 * 64]
        addrs[1] = Evil(addrs)
        mover = Mover(mem.l2._core, 512, 64, {}, mem._lines_of, None, [], None, None, Signal, None, None)
        try:
            mover.transfer(addrs, 64, 1, 64, False, 1.0, print)
        except RuntimeError as e:
            print(e)
        arrays = lambda: [memoryview(array(t, [0] * 64)) for t in "iiBi"]
        core = Core(*arrays(), 4, 16, 0)

        def lines_of(*args):
            try:
                core.__init__(*arrays(), 0, 16, 0)
            except ValueError:
                pass
            return (memoryview(array("q", [0, 1])), None, 0)

        mover = Mover(core, 512, 64, {}, lines_of, None, [], None, None, Signal, None, None)
        try:
            mover.transfer([0], 64, 1, 64, False, 1.0, print)
        except TypeError as e:
            print(e)
    """)
    assert out.splitlines() == [
        "transfer: addrs changed while they were read",
        "L2 core: not initialised (Core(tags, last_use, dirty, fill, sets, ways, rotate) first)"]


# ------------------------------------------------------------------ arrays of another type (_l2.c)


def l2_arrays(**instead):
    import numpy as np

    arrays = {"tags": np.full(64, -1, np.int32), "last_use": np.zeros(64, np.int32), "dirty": np.zeros(64, np.uint8),
              "fill": np.zeros(64, np.int32)}
    return [instead.get(name, array) for name, array in arrays.items()]


def misaligned(dtype, n: int):
    """A writable array of n `dtype` items one byte off their alignment."""
    import numpy as np

    raw = bytearray(n * np.dtype(dtype).itemsize + 1)
    out = np.frombuffer(memoryview(raw)[1:], dtype)
    assert not out.flags.aligned and out.flags.writeable
    return out


def test_an_l2_core_refuses_arrays_of_another_type_or_misaligned():
    """Only the items' size was checked: float32 tags (their bits read as ints) or uint32
    fills were walked as garbage, and an array one byte off its alignment was read
    misaligned (undefined in C: UBSan reports it)."""
    import numpy as np

    from npusim.engine._l2 import Core

    for name, bad, got in (("tags", np.full(64, -1, np.float32), "64 int32s (got format 'f', 256 bytes)"),
                           ("fill", np.zeros(64, np.uint32), "64 int32s (got format 'I', 256 bytes)"),
                           ("dirty", np.zeros(64, "S1"), "64 bytes (got format '1s', 64 bytes)"),
                           ("last_use", misaligned(np.int32, 64), "be aligned to its 4-byte items")):
        with pytest.raises(ValueError) as e:
            Core(*l2_arrays(**{name: bad}), 4, 16, 0)
        assert one_line(e.value) == f"L2 core: {name} must {'' if 'aligned' in got else 'hold '}{got}"
    core = Core(*l2_arrays(), 4, 16, 0)
    lines = misaligned(np.int64, 3)
    for call in (lambda: core.access(lines, False, 0, False), lambda: core.find(lines)):
        with pytest.raises(ValueError) as e:
            call()
        assert one_line(e.value) == "L2 core: lines must be an aligned, contiguous int64 array"
    assert core.find(np.zeros(3, np.int64)) == np.full(3, -1, np.int64).tobytes()  # aligned: as before


def test_a_walker_initialised_again_is_refused_before_it_changes(monkeypatch):
    """__init__ on a built Walker is refused, but it had set the cross-core latency
    from its arguments first: the walk's cross-core flags then arrived that late."""
    spans = simulate_on_device(cross_kernel(HW, 0), HW).trace.intervals

    def walker(*args):
        walk = Walker(*args)
        cross = args[22]
        with pytest.raises(TypeError) as e:
            walk.__init__(*args[:22], (*cross[:5], 10**6), *args[23:])
        assert one_line(e.value) == "pipe Walker: already initialised"
        return walk

    monkeypatch.setattr(pipe, "Walker", walker)
    assert simulate_on_device(cross_kernel(HW, 0), HW).trace.intervals == spans


def test_a_code_half_built_is_not_a_loop_body():
    """A Code's build converts a loop count by its __index__: Python code that made another
    Code whose loop body was the one half built, which then took that Code as a later
    loop's body - a loop that holds itself (a walk of it would nest without end)."""
    inner = Code.__new__(Code)

    class Count:
        def __index__(self):
            inner.__init__(((K_LOOP, None, "", "j", 2, outer),), 0)
            return 2

    outer = Code.__new__(Code)
    fixed = Code(((0, None, "add", 1, 0.0, (), ()),), 0)
    with pytest.raises(TypeError) as e:
        outer.__init__(((K_LOOP, None, "", "i", Count(), fixed), (K_LOOP, None, "", "k", 2, inner)), 0)
    assert one_line(e.value) == "pipe Code: op 0: a loop's body is not initialised (Code(ops, n_mems))"


def test_a_link_initialised_again_is_refused():
    """Flows.__init__ on a link with a flow in flight reset its clock and timer but kept the
    flow: its timer, found superseded, ended nothing and the flow never ended. Now refused."""
    from npusim.engine._flows import Flows
    from npusim.engine.cycles import whole_cycles
    from npusim.engine.events import at_delay

    env, flows = flows_link()
    ended = []
    env.run(until=5)
    flows.start(100, 10.0, lambda: ended.append(env.now))
    with pytest.raises(TypeError) as e:
        flows.__init__(100.0, None, whole_cycles, env, at_delay)
    assert one_line(e.value) == "Flows: already initialised"
    env.run()
    assert ended == [15] and isinstance(flows, Flows)


def test_a_mover_refusing_new_arguments_keeps_its_own():
    """Mover.__init__ with a line beyond the most is refused, but it had taken the new
    environment, Signal, HBM link and callback first: the mover's next read that missed
    made its fill with the Signal it had refused."""
    from npusim.engine.memory import MemorySystem

    env = Environment()
    mem = MemorySystem(env, HW, record=False)
    mover = mem.transfer.__self__

    def refused(env):
        raise AssertionError("the refused Signal was used")

    with pytest.raises(ValueError) as e:
        mover.__init__(mem.l2._core, 2**59, 64, {}, mem._lines_of, None, [], None, None, refused, None, None)
    assert f"a line of {2**59} bytes" in one_line(e.value)
    ended = []
    mem.transfer([0x1000_0000], 4096, 1, 4096, False, 64.0, lambda: ended.append(env.now))  # misses: a fill
    env.run()
    assert len(ended) == 1


# ------------------------------------------------------------------ callbacks that are not a list


def test_an_event_whose_callbacks_are_not_a_list_is_a_type_error(monkeypatch):
    """The loop said such an event was 'processed twice' (it was not), and a walk that
    waited on one failed with a SystemError (bad argument to an internal function)."""
    env = Environment()
    signal = Signal(env)
    signal.callbacks = (print,)
    signal.fire()
    with pytest.raises(TypeError) as e:
        env.run()
    assert one_line(e.value) == "event queue: an event's callbacks must be a list, got tuple"

    class Held:
        callbacks = ()

    def walker(*args):  # its copies' start-ups are timeouts whose callbacks are a tuple
        return Walker(*args[:12], lambda env, delay: Held(), *args[13:])

    monkeypatch.setattr(pipe, "Walker", walker)
    with pytest.raises(TypeError) as e:
        simulate_on_device(pipeline_kernel(HW, 4096, 2, False), HW)
    assert one_line(e.value) == "pipe walk: an event's callbacks must be a list, got tuple"


def test_a_fill_id_given_again_while_in_flight_counts_once():
    """Two accesses that missed with one fill id counted two fills in flight, and its
    arrival one: the core said a fill was in flight for ever after."""
    from array import array

    from npusim.engine._l2 import Core

    core = Core(*l2_arrays(), 4, 16, 0)
    lines = lambda *xs: memoryview(array("q", xs))  # noqa: E731
    core.access(lines(0, 1), False, 7, False)
    core.access(lines(2, 3), False, 7, False)
    assert core.in_flight == 1
    core.arrived(7)
    assert core.in_flight == 0
    with pytest.raises(ValueError) as e:
        core.arrived(7)
    assert one_line(e.value) == "L2 core: fill 7 is not in flight"


def test_a_flush_of_no_blocks_or_fewer_is_refused(monkeypatch):
    """flush(counters, mems, weight) multiplied the bytes written by any weight: 0 dropped
    them and -1 took them off the kernel's counters. A run stands for one block or more."""
    from collections import defaultdict

    from npusim.engine.compile import MEMS

    walkers = []
    monkeypatch.setattr(pipe, "Walker", lambda *args: walkers.append(Walker(*args)) or walkers[-1])
    simulate_on_device(pipeline_kernel(HW, 4096, 2, False), HW)
    for walk in walkers:
        for weight in (0, -1):
            with pytest.raises(ValueError) as e:
                walk.flush(defaultdict(float), MEMS, weight)
            assert one_line(e.value) == f"flush: a weight of {weight} blocks, expected at least 1"


@pytest.mark.parametrize("cost", [-1, -0.5, float("nan"), float("inf")])
def test_a_cost_that_is_negative_or_not_finite_is_refused_by_the_code(cost):
    """A fixed cost, a part's cost or a copy's start-up of -1 moved the pipe's clock back
    (and its busy cycles below 0); a NaN reached the event queue far from its op."""
    for op, what in (((0, None, "add", cost, 0.0, (), ()), "a cost"),
                     ((1, None, "run", 3, 0.0, (), (("add", cost),)), "a part's cost"),
                     ((6, None, "GM->UB", cost, 64.0, False, 0, (), 64, 1, 64, 0, 0), "a start-up")):
        with pytest.raises(ValueError) as e:
            Code((op,), 1)
        assert one_line(e.value) == f"pipe Code: op 0: {what} of {cost!r} cycles, expected a finite number >= 0"


@pytest.mark.parametrize("latency", [-1, float("nan")])
def test_a_flag_latency_that_is_negative_or_not_finite_is_refused_by_the_walker(monkeypatch, latency):
    """A set was visible before it was made (or at NaN, which reached the queue later)."""
    made = []
    monkeypatch.setattr(pipe, "Walker", lambda *args: made.append(args) or Walker(*args))
    simulate_on_device(cross_kernel(HW, 0), HW)
    args = made[0]
    for built, what in ((lambda: Walker(*args[:3], latency, *args[4:]), "a flag latency"),
                        (lambda: Walker(*args[:22], (*args[22][:5], latency), *args[23:]),
                         "a cross-core flag latency")):
        with pytest.raises(ValueError) as e:
            built()
        assert one_line(e.value) == f"pipe Walker: {what} of {latency!r} cycles, expected a finite number >= 0"


# ------------------------------------------------------------------ a walker's own arguments (_pipe.c)

WALKER = """
        from npusim.engine import _pipe
        from npusim.engine.cycles import whole_cycles
        from npusim.engine.events import Environment, Signal, after

        def walker(code, env=None, flags=None, signal=Signal, intervals=None):
            \"\"\"A Walker of `code` on one core of its own, started.\"\"\"
            env = env or Environment()
            flags = _pipe.Flags() if flags is None else flags
            walk = _pipe.Walker(code, {}, flags, 1, 0, intervals, ("core0",), "V", 0, env, print, signal, after,
                                whole_cycles, {}, ("core0", "V"), [0], 1, None, RuntimeError, print,
                                lambda walk: None, (_pipe.Flags(), (), 0, 1, 1, 1), 1)
            walk.start()
            return walk
"""


def test_a_code_half_built_is_not_walked():
    """A Code's build converts a fixed entry's flops by their __float__: Python code that
    made a Walker of the Code half built and walked it read the entries not built yet (no
    name: a crash as its trace took it). The Walker refuses it, as a loop does."""
    out = isolated(WALKER + """
        class Flops:
            def __float__(self):
                try:
                    walker(code, intervals=[]).resume(None)
                except TypeError as e:
                    print(e)
                return 0.0

        code = _pipe.Code.__new__(_pipe.Code)
        code.__init__(((0, None, "add", 1, Flops(), (), ()), (0, None, "add", 1, 0.0, (), ())), 0)
        intervals = []
        walker(code, intervals=intervals).resume(None)
        print(len(intervals))
    """)
    assert out.splitlines() == ["pipe Walker: its Code is not initialised (Code(ops, n_mems))", "2"], out


def test_a_signal_made_for_a_wait_that_moves_or_sets_its_flag_is_refused():
    """A wait whose flag is not set makes a Signal, then queues it on the flag: a Signal type
    of Python's that walked another pipe of the core there, setting a flag far past the
    core's flags so far, moved them (a use after free of the flag it then queued on). The
    flag is found again after; had that walk set this very flag, the wait would wait behind
    a set no one takes: refused."""
    out = isolated(WALKER + """
        def one_wait(flag_set_meanwhile):
            env, flags, meanwhile = Environment(), _pipe.Flags(), []

            class Made:  # a Signal of Python's: resumes the other pipe while the wait makes it
                def __init__(self, env):
                    self.env, self.callbacks, self._value = env, [], None
                    if meanwhile:
                        meanwhile.pop().resume(None)

                def fire(self, value=None):
                    self._value = value

            setter = walker(_pipe.Code(((2, None, "set", flag_set_meanwhile),), 0), env, flags)
            waiter = walker(_pipe.Code(((3, None, "wait", 0),), 0), env, flags, Made)
            meanwhile.append(setter)
            try:
                waiter.resume(None)
                print("waits")
            except RuntimeError as e:
                print(e)

        one_wait(1 << 20)
        one_wait(0)
    """)
    assert out.splitlines() == ["waits", "pipe walk: flag 0 was set while its wait's Signal was made (a callback it "
                                          "called)"], out


@pytest.mark.parametrize("op, named", [
    ((2**32 + 2, None, "set", 0), "unknown kind 4294967298"),  # cut to 2: a SetFlag of flag 0
    ((-1, None, "x"), "unknown kind -1"),
    ((0, None, "add", 1, math.nan, (), ()), "flops of nan, expected a finite number >= 0"),  # the kernel's: NaN
    ((0, None, "add", 1, math.inf, (), ()), "flops of inf, expected a finite number >= 0"),
    ((1, None, "run", 1, -16.0, (), ()), "flops of -16.0, expected a finite number >= 0"),  # counted negative
    ((0, None, "add", 1, 0.0, ((0, -64),), ()), "a local write of -64 bytes, expected >= 0"),  # taken off
    ((4, None, "", "i", -5, Code((), 1)), "a loop count of -5, expected >= 0"),
    ((6, None, "GM->UB", 0, 64.0, False, 0, (), -64, 1, 64, 0, 0), "a copy of 1 segments of -64 bytes"),
    ((6, None, "GM->UB", 0, 64.0, False, 0, (), 64, -1, 64, 0, 0), "a copy of -1 segments of 64 bytes"),
    ((6, None, "GM->UB", 0, 64.0, False, 0, (), 0, 1, 64, 0, 0), "a copy of 1 segments of 0 bytes"),
])
def test_a_code_entry_of_an_unknown_kind_or_a_negative_or_nan_size_is_refused(op, named):
    """Each was taken: the kind cut to an int, flops and local bytes and a copy's sizes
    added into the kernel's counters as they were (NaN, negative), a negative loop count
    a loop of no trips. verify() refuses such instructions; the Code does too."""
    with pytest.raises(ValueError) as e:
        Code((op,), 1)
    assert one_line(e.value).startswith(f"pipe Code: op 0: {named}")


@pytest.mark.parametrize("value", [math.nan, math.inf, -5.0, -5])
def test_a_walker_clock_or_counter_that_is_nan_infinite_or_negative_is_refused(monkeypatch, value):
    """A Walker's clock (made with it, or set: meet sets it after a barrier) and its counters
    (meet adds into them) took a NaN, inf or negative value as it was: a NaN clock's
    comparisons are all false (a flag's wait, a copy's start), and the counters go into
    the kernel's."""
    made = []
    monkeypatch.setattr(pipe, "Walker", lambda *args: made.append(args) or Walker(*args))
    simulate_on_device(cross_kernel(HW, 0), HW)
    args = made[0]
    with pytest.raises(ValueError) as e:
        Walker(*args[:4], value, *args[5:])
    assert one_line(e.value) == f"pipe Walker: a clock of {value!r} cycles, expected a finite number >= 0"
    walk = Walker(*args)
    with pytest.raises(ValueError) as e:
        walk.t = value
    assert one_line(e.value) == f"pipe Walker: a clock of {value!r} cycles, expected a finite number >= 0"
    assert walk.t == args[4]
    for counter in ("busy", "waited", "flops", "data_wait") if isinstance(value, float) else ():
        with pytest.raises(ValueError) as e:
            setattr(walk, counter, value)
        assert one_line(e.value) == f"pipe Walker: {counter} of {value!r}, expected a finite number >= 0"
        assert getattr(walk, counter) == 0.0


def test_a_burst_rounding_of_a_negative_size_is_refused():
    """A segment of -1000 bytes was rounded to -960 bytes moved (its end before its start),
    by the C and the Python rule alike; now each refuses a negative size. No segments, or
    segments of no bytes, round as they did."""
    from memory_reference import burst_cost as rule

    for args, named in (((0, -1000, 1, 0, 64), "1 segments of -1000 bytes"),
                        ((0, 64, -3, 64, 64), "-3 segments of 64 bytes")):
        for cost in (burst_cost, rule):
            with pytest.raises(ValueError) as e:
                cost(*args)
            assert one_line(e.value) == f"burst_cost: {named}, expected each >= 0"
    for args in ((0, 64, 0, 64, 64), (3, 0, 2, 100, 64)):
        assert burst_cost(*args) == rule(*args)


@pytest.mark.parametrize("nbytes, cap, capacity", [(1e10, 5e-324, 100.0), (1e308, 10.0, 1e-300)])
def test_a_flow_that_alone_would_take_more_cycles_than_a_double_holds_is_refused(nbytes, cap, capacity):
    """Its time to end was inf: its end was never found (as at a cap of 0), and it stayed
    in flight for ever with no word of it."""
    env, flows = flows_link(capacity)
    with pytest.raises(ValueError) as e:
        flows.start(nbytes, cap, print)
    assert one_line(e.value) == (f"Flows.start: nbytes {nbytes!r} at cap {cap!r} on a link of {capacity!r} bytes per "
                                 "cycle: more cycles than a double holds (it would never end)")
    assert flows.active == 0
    flows.start(100, 10.0, print)  # one that ends still does
    env.run()
    assert flows.active == 0


def test_a_transfer_of_no_bytes_is_refused():
    """A transfer of 0 bytes (or no segments) touched no L2 line and divided its hit share
    0 / 0: a ZeroDivisionError (an IndexError for no segments). A lowered Copy cannot ask
    for one (verify() refuses nbytes or segments below 1), so the C and its Python
    statement refuse it alike, in one line."""
    import memory_reference

    from npusim.engine import memory
    from npusim.engine.memory import MemorySystem

    for mover in (memory.Mover, memory_reference.Mover):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(memory, "Mover", mover)
            mem = MemorySystem(Environment(), HW, record=False)
        for nbytes, segments in ((0, 1), (64, 0)):
            with pytest.raises(ValueError) as e:
                mem.transfer([0x1000_0000], nbytes, segments, 64, False, 64.0, print)
            assert one_line(e.value) == f"transfer: {segments} segments of {nbytes} bytes, expected each >= 1"
