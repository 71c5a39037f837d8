"""Hand-written kernels with hostile values, through the public entry points: verify(),
simulate() and the functional interpreter (npusim.isa.interpret.run_kernel). Each ends in
one ProgramError (or DeadlockError) line naming the kernel, block, core and instruction
(or field) at fault: never a Python error from inside, a hang or a number from a kernel
the device could not run."""

from __future__ import annotations

import pytest
from kernels import cube_program, deadline, mix_kernel

from npusim.engine import simulate
from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa import (
    Affine, Buffer, Copy, CoreType, CrossSetFlag, CrossWaitFlag, GmTensor, Kernel, Loop, Mem, Mmad, Pipe,
    PipeBarrier, Program, Scalar, SetFlag, VecOp, WaitFlag, verify,
)

HW = load_hw("ascend910b2")
GM, UB = Mem.GM, Mem.UB
UB_BUF = Buffer("ub", UB, 0, 65536)
X = GmTensor("x", 0, 1 << 20)


def aiv(body, block_dim=1, gm=(X,), buffers=(UB_BUF,), **kw) -> Kernel:
    return Kernel("k", CoreType.AIV, block_dim, aiv=[Program(body, buffers)], gm=gm, op_type="add", **kw)


def aic(body) -> Kernel:
    return Kernel("k", CoreType.AIC, 1, aic=[cube_program(HW, body)], op_type="mm")


def copy(**kw) -> Copy:
    return Copy(**{"src": GM, "dst": UB, "src_addr": 0, "dst_addr": 0, "nbytes": 64, **kw})


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text, repr(text)
    return text


def refused(kernel: Kernel, match: str) -> None:
    """verify() and simulate() both refuse `kernel` with one ProgramError line matching `match`."""
    for check in (lambda: verify(kernel, HW), lambda: simulate(kernel, HW, trace="kernel")):
        with pytest.raises(ProgramError) as e:
            check()
        assert __import__("re").search(match, one_line(e.value)), str(e.value)


# ---------------------------------------------------------------- field types

# Each was a TypeError / ValueError / AttributeError from inside verify() or the engine
# ("'<' not supported between instances of 'str' and 'int'", "Unknown format code 'x' for
# object of type 'float'", "'float' object cannot be interpreted as an integer"), or ran
# with a bool taken as 1 or a float as a size.
WRONG_TYPES = {
    "copy nbytes str": (aiv([copy(nbytes="64")]), r"instr 0 Copy\(.*\): nbytes '64' is a str, expected an int"),
    "copy nbytes float": (aiv([copy(nbytes=64.0)]), r"nbytes 64\.0 is a float, expected an int"),
    "copy nbytes nan": (aiv([copy(nbytes=float("nan"))]), r"nbytes nan is a float, expected an int"),
    "copy segments bool": (aiv([copy(segments=True)]), r"segments True is a bool, expected an int"),
    "copy stride float": (aiv([copy(src_stride=1.5)]), r"src_stride 1\.5 is a float, expected an int or None"),
    "copy mem str": (aiv([copy(src="GM")]), r"src 'GM' is a str, expected a Mem"),
    "loop count float": (aiv([Loop("i", 3.0, [copy()])]), r"instr 0 Loop\('i', count=3\.0\): count 3\.0 is a float"),
    "loop count None": (aiv([Loop("i", None, [copy()])]), r"count None is a NoneType, expected an int"),
    "loop var int": (aiv([Loop(3, 2, [copy()])]), r"var 3 is an int, expected a str"),
    "flag id str": (aiv([SetFlag(Pipe.MTE2, Pipe.V, "1"), WaitFlag(Pipe.MTE2, Pipe.V, "1")]),
                    r"id '1' is a str, expected an int"),
    "flag id float": (aiv([SetFlag(Pipe.MTE2, Pipe.V, 1.5), WaitFlag(Pipe.MTE2, Pipe.V, 1.5)]),
                      r"id 1\.5 is a float, expected an int"),
    "flag pipe str": (aiv([SetFlag("MTE2", "V"), WaitFlag("MTE2", "V")]), r"src 'MTE2' is a str, expected a Pipe"),
    "barrier pipe str": (aiv([PipeBarrier("V")]), r"pipe 'V' is a str, expected a Pipe or None"),
    "cross id float": (mix_kernel(HW, [CrossSetFlag(Pipe.FIX, 1.0)], [CrossWaitFlag(Pipe.MTE2, 1.0)]),
                       r"id 1\.0 is a float, expected an int"),
    "vec n None": (aiv([VecOp("add", None, "fp16", 0, (256, 512))]), r"n None is a NoneType, expected an int"),
    "vec n inf": (aiv([VecOp("add", float("inf"), "fp16", 0, (256, 512))]), r"n inf is a float, expected an int"),
    "vec srcs None": (aiv([VecOp("add", 16, "fp16", 0, None)]), r"srcs None is a NoneType, expected a tuple"),
    "vec srcs list": (aiv([VecOp("add", 16, "fp16", 0, [256, 512])]), r"srcs \[256, 512\] is a list, expected a tuple"),
    "vec op list": (aiv([VecOp(["add"], 16, "fp16", 0, (256, 512))]), r"op \['add'\] is a list, expected a str"),
    "vec dtype None": (aiv([VecOp("add", 16, None, 0, (256, 512))]), r"dtype None is a NoneType, expected a str"),
    "vec flops str": (aiv([VecOp("add", 16, "fp16", 0, (256, 512), flops_per_elem="1")]),
                      r"flops_per_elem '1' is a str, expected an int"),
    "vec scalar str": (aiv([VecOp("muls", 16, "fp16", 0, (256,), scalar="2")]),
                       r"scalar '2' is a str, expected a number, an Affine or None"),
    "mmad m float": (aic([Mmad(16.0, 16, 16)]), r"instr 0 Mmad\(.*\): m 16\.0 is a float, expected an int"),
    "mmad accumulate str": (aic([Mmad(16, 16, 16, accumulate="yes")]), r"accumulate 'yes' is a str"),
    "scalar cycles str": (aiv([Scalar("5")]), r"cycles '5' is a str, expected a number of cycles"),
    "affine base float": (aiv([copy(src_addr=Affine(1.5, (("block", 64),)))]),
                          r"src address Affine\(1\.5, .*\): base 1\.5 is a float, expected an int"),
    "affine terms str": (aiv([copy(src_addr=Affine(0, "ab"))]),
                         r"src address Affine\(0, 'ab'\): terms 'ab' is a str, expected a tuple of \(var, step\)"),
    "affine step float": (aiv([Loop("i", 2, [copy(src_addr=Affine(0, (("i", 64.0),)))])]),
                          r"term \('i', 64\.0\) is not a \(var, step\) pair of a str and an int"),
    "block_dim str": (aiv([copy()], block_dim="2"), r"^kernel 'k': block_dim '2' is a str, expected an int$"),
    "block_dim float": (aiv([copy()], block_dim=2.0), r"^kernel 'k': block_dim 2\.0 is a float, expected an int$"),
    "block_dim bool": (aiv([copy()], block_dim=True), r"block_dim True is a bool, expected an int"),
    "workspace negative": (aiv([copy()], workspace_bytes=-1), r"workspace_bytes -1 must be >= 0"),
    "workspace nan": (aiv([copy()], workspace_bytes=float("nan")), r"workspace_bytes nan is a float"),
    "core type str": (Kernel("k", "AIV", 1, aiv=[Program([Scalar(1)])]),
                      r"^kernel 'k': core_type 'AIV' is a str, expected a CoreType \(AIC, AIV, MIX\)$"),
    "gm not a tensor": (aiv([copy()], gm=["x"]), r"^kernel 'k': gm\[0\] is a str, expected a GmTensor$"),
    "gm addr float": (aiv([copy()], gm=[GmTensor("x", 0.0, 1 << 20)]), r"GmTensor 'x': addr 0\.0 is a float"),
    "gm nbytes inf": (aiv([copy()], gm=[GmTensor("x", 0, float("inf"))]), r"GmTensor 'x': nbytes inf is a float"),
    "gm addr negative": (aiv([copy()], gm=[GmTensor("x", -64, 1 << 20)]), r"GmTensor 'x': addr -64 must be >= 0"),
    "buffer not a Buffer": (aiv([Scalar(1)], buffers=["ub"]), r"AIV: buffers\[0\] is a str, expected a Buffer"),
    "buffer mem str": (aiv([Scalar(1)], buffers=[Buffer("ub", "UB", 0, 64)]),
                       r"buffer 'ub': mem 'UB' is a str, expected a Mem"),
    "buffer addr float": (aiv([Scalar(1)], buffers=[Buffer("ub", UB, 0.0, 64)]),
                          r"buffer 'ub': addr 0\.0 is a float, expected an int"),
    "buffer nbytes None": (aiv([Scalar(1)], buffers=[Buffer("ub", UB, 0, None)]),
                           r"buffer 'ub': nbytes None is a NoneType, expected an int"),
}


@pytest.mark.parametrize("kernel, match", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_a_field_of_the_wrong_type_is_named(kernel, match):
    refused(kernel, match)


# ---------------------------------------------------------------- sizes past what runs


@pytest.mark.parametrize("block_dim", [65536, 1 << 63])
def test_a_block_dim_past_ascend_cs_is_refused(block_dim):
    """block_dim 2^63 ran forever in the engine, one block after another."""
    with deadline(20):
        refused(aiv([copy()], block_dim=block_dim),
                rf"^kernel 'k': block_dim {block_dim} must be 1 to 65535 \(Ascend C's blockDim\)$")


def test_the_most_blocks_run():
    kernel = Kernel("k", CoreType.AIV, 65535, aiv=[Program([Scalar(1)])])
    with deadline(20):
        assert simulate(kernel, HW, trace="kernel").kernels[0].block_dim == 65535


# Each was an error from inside the engine's C code, after verify() passed it: 'L2 core: line
# number -1 is negative', '... past the last one a 32-bit tag can name', 'int too big to
# convert' (a stride or step the engine takes even where it moves nothing: one segment, a loop of one)
GM_END = r"0x60000000000000"  # hw.checks.gm_named_bytes of the 910B2: 2^31 tags x 24576 sets x 512-byte lines
PAST_GM = {
    "negative GM address": (aiv([copy(src_addr=-64)], gm=()),
                            rf"instr 0 Copy\(.*\): src GM \[-0x40, 0x0\) over all blocks and iterations is outside "
                            rf"\[0x0, {GM_END}\), the GM addresses the simulated device has"),
    "GM address 2^62": (aiv([copy(dst=GM, src=UB, dst_addr=1 << 62)], gm=()),
                        rf"dst GM \[0x4000000000000000, 0x4000000000000040\) .* is outside \[0x0, {GM_END}\)"),
    "GM address 2^63": (aiv([copy(src_addr=1 << 63)], gm=()), r"src GM \[0x8000000000000000, "),
    "negative block step": (aiv([copy(src_addr=Affine(0, (("block", -64),)))], block_dim=2, gm=()),
                            r"src GM \[-0x40, 0x40\) over all blocks"),
    "GmTensor past GM": (aiv([copy()], gm=[GmTensor("x", 1 << 62, 64)]),
                         rf"^kernel 'k': GmTensor 'x' \[0x4000000000000000, 0x4000000000000040\) reaches past {GM_END}"),
    "stride 2^63, one segment": (aiv([copy(src_stride=1 << 63)]),
                                 rf"src stride 9223372036854775808 is longer than any memory of the device \(its GM: "
                                 rf"{GM_END} bytes\)"),
    "UB stride -2^63": (aiv([copy(dst_stride=-(1 << 63))]), r"dst stride -9223372036854775808 is longer than any"),
    "step 2^63, loop of one": (aiv([Loop("i", 1, [copy(src_addr=Affine(0, (("i", 1 << 63),)))])]),
                               r"instr 0\.0 Copy\(.*\): src address .*: step 9223372036854775808 of 'i' is longer "
                               r"than any memory"),
}


@pytest.mark.parametrize("kernel, match", PAST_GM.values(), ids=PAST_GM.keys())
def test_gm_addresses_strides_and_steps_past_the_device(kernel, match):
    refused(kernel, match)


def test_the_last_gm_line_runs():
    from npusim.hw.checks import gm_named_bytes

    end = gm_named_bytes(HW)
    kernel = aiv([copy(src_addr=end - 64)], gm=[GmTensor("x", end - 4096, 4096)])
    assert simulate(kernel, HW, trace="kernel").cycles > 0


@pytest.mark.parametrize("cycles", [float("nan"), float("inf"), (1 << 40) + 1, 1 << 63])
def test_scalar_cycles_past_a_step_are_refused(cycles):
    """NaN and inf were ValueErrors from the engine's C code ('pipe Code: op 0: a cost of nan
    cycles'), naming no kernel or instruction; 2^63 an OverflowError ('a cycle count beyond 2^53')."""
    refused(aiv([Scalar(cycles)]), rf"instr 0 Scalar\(cycles={cycles!r}\): cycles {cycles!r} must be >= 0 and at most 2\^40")


def test_scalar_cycles_of_a_whole_step_run():
    assert simulate(aiv([Scalar(1 << 40), Scalar(0.5)]), HW, trace="kernel").cycles >= 1 << 40


def nest(depth: int, inner) -> list:
    """`depth` loops of one trip, each in the last; `inner` in the innermost."""
    body = inner
    for i in reversed(range(depth)):
        body = [Loop(f"v{i}", 1, body)]
    return body


@pytest.mark.parametrize("depth", [65, 1000])
def test_loops_nested_past_the_most_are_refused(depth):
    """1000 loops in one another were a RecursionError from inside verify()."""
    refused(aiv(nest(depth, [copy()])), r"instr 0(\.0){64} Loop\('v64', count=1\): loops nested 65 deep, more than "
                                        r"the 64 a program may nest")


def test_loops_nested_to_the_most_run():
    assert simulate(aiv(nest(64, [copy()])), HW, trace="kernel").cycles > 0


# ---------------------------------------------------------------- fields only the interpreter reads

# Each passed verify() and simulate() (none changes a cost) while naming what no kernel
# can do: an unknown conversion, a level of pitches that places no element (count 0 or
# -2: the interpreter ran nothing, or divided by zero), a scalar read back from outside UB,
# an Affine scalar of a var no loop defines (a KeyError in the interpreter).
UNREAD = {
    "unknown convert": (aiv([copy(convert="nd2nz_b12")]),
                        r"convert 'nd2nz_b12' is not a conversion of isa.instructions.CONVERSIONS"),
    "group of 0 rows": (aiv([copy(convert="nd2nz_b16:0")]), r"convert 'nd2nz_b16:0' is not a conversion"),
    "pitches count 0": (aiv([VecOp("add", 16, "fp16", 0, (256, 512), pitches=((0, 64, 64, 64),))]),
                        r"pitches level \(0, 64, 64, 64\): the count must be >= 1 and each pitch >= 0"),
    "pitches count -2": (aiv([VecOp("add", 16, "fp16", 0, (256, 512), pitches=((-2, 64, 64, 64),))]),
                         r"pitches level \(-2, 64, 64, 64\): the count must be >= 1"),
    "pitches negative": (aiv([VecOp("add", 16, "fp16", 256, (512, 1024), pitches=((2, -64, 64, 64),))]),
                         r"pitches level \(2, -64, 64, 64\): the count must be >= 1 and each pitch >= 0"),
    "pitches not runs": (aiv([VecOp("add", 16, "fp16", 0, (256, 512), pitches=((3, 64, 64, 64),))]),
                         r"n 16 is not whole runs of the pitches' 3"),
    "pitches level list": (aiv([VecOp("add", 16, "fp16", 0, (256, 512), pitches=([2, 64, 64, 64],))]),
                           r"pitches level \[2, 64, 64, 64\]: expected a tuple of ints"),
    "scalar_src past UB": (aiv([VecOp("muls", 16, "fp16", 0, (256,), scalar_src=1 << 63)]),
                           r"scalar_src UB \[0x8000000000000000, 0x8000000000000004\) .* is not inside one declared"),
    "scalar_src misaligned": (aiv([VecOp("muls", 16, "fp16", 0, (256,), scalar_src=2)]),
                              r"scalar_src UB address 2: base 2 is not a multiple of 4 \(its 4-byte element\)"),
    "scalar of no loop": (aiv([VecOp("adds", 16, "fp16", 0, (256,), scalar=Affine(0, (("i", 1),)))]),
                          r"scalar address 0x0\+1\*i uses var 'i', not in scope"),
    "accumulate of no loop": (aic([Mmad(16, 16, 16, accumulate=Affine(0, (("kk", 1),)))]),
                              r"accumulate address 0x0\+1\*kk uses var 'kk', not in scope"),
}


@pytest.mark.parametrize("kernel, match", UNREAD.values(), ids=UNREAD.keys())
def test_what_only_the_interpreter_reads_is_checked_too(kernel, match):
    refused(kernel, match)


def test_a_scalar_read_back_from_any_fp32_element_runs():
    kernel = aiv([Loop("i", 4, [VecOp("muls", 16, "fp32", 0, (256,), scalar_src=Affine(1024, (("i", 4),)))])])
    assert simulate(kernel, HW, trace="kernel").cycles > 0


# ---------------------------------------------------------------- the functional interpreter


def interpret(kernel: Kernel, gm=None) -> None:
    from npusim.isa.interpret import Gm, run_kernel

    with deadline(20):
        run_kernel(kernel, HW, Gm(0, 1 << 20) if gm is None else gm)


# The interpreter ran kernels verify() refuses: block_dim 0 and nbytes -1 ran nothing and
# returned; overlapping buffers ran; m=0 was a numpy ValueError ('cannot reshape array of
# size 0'); a float nbytes an IndexError; an unknown dtype a KeyError
UNVERIFIED = {
    "block_dim 0": (aiv([copy()], block_dim=0), r"^kernel 'k': block_dim 0 must be 1 to 65535"),
    "nbytes -1": (aiv([copy(nbytes=-1)]), r"nbytes -1 and segments 1 must be >= 1"),
    "overlapping buffers": (aiv([Scalar(1)], buffers=[Buffer("a", UB, 0, 64), Buffer("b", UB, 32, 64)]),
                            r"buffers 'a' \[0x0, 0x40\) and 'b' \[0x20, 0x60\) overlap in UB"),
    "mmad m 0": (aic([Mmad(0, 16, 16)]), r"m 0, n 16, k 16 must all be >= 1"),
    "nbytes float": (aiv([copy(nbytes=1.5)]), r"nbytes 1\.5 is a float, expected an int"),
    "unknown dtype": (aiv([VecOp("add", 16, "fp7", 0, (256, 512))]), r"dtype 'fp7' is not one of"),
}


@pytest.mark.parametrize("kernel, match", UNVERIFIED.values(), ids=UNVERIFIED.keys())
def test_the_interpreter_runs_only_what_verify_passes(kernel, match):
    with pytest.raises(ProgramError, match=match) as e:
        interpret(kernel)
    one_line(e.value)


def test_the_interpreter_refuses_a_long_loop_without_laying_it_out():
    """A loop of 2^30 trips (as many as verify() passes) pushed every trip on a stack before
    its first instruction: it ran for minutes and took gigabytes; now the step limit ends it."""
    from npusim.isa.walk import TooLarge

    with pytest.raises(TooLarge, match=r"program runs more than 50000 instructions once unrolled"):
        interpret(aiv([Loop("i", 1 << 30, [Scalar(1)])]))


def test_the_interpreter_skips_loops_of_nothing():
    interpret(aiv([Loop("i", 1 << 62, [Loop("j", 1 << 62, [])]), copy()]))


def test_the_interpreter_refuses_more_local_memory_than_it_allocates():
    """65535 blocks asked numpy for 12 GB of UB."""
    from npusim.isa.walk import TooLarge

    with pytest.raises(TooLarge, match=r"its 65535 blocks hold 12884705280 bytes of local memory, more than the "
                                       r"1073741824 the interpreter allocates"):
        interpret(aiv([Scalar(1)], block_dim=65535))


def test_the_interpreter_names_a_gm_that_is_not_one():
    with pytest.raises(ProgramError, match=r"^kernel 'k': gm is 'bytearray', expected an interpret.Gm$"):
        interpret(aiv([copy()]), bytearray(64))


def test_flags_that_balance_but_wait_on_each_other_deadlock_named():
    """verify() counts flags; the order they wait in is the interpreter's (and the engine's) to find."""
    from npusim.errors import DeadlockError

    body = [WaitFlag(Pipe.MTE2, Pipe.V, 0), SetFlag(Pipe.V, Pipe.MTE2, 1),
            WaitFlag(Pipe.V, Pipe.MTE2, 1), SetFlag(Pipe.MTE2, Pipe.V, 0)]
    with pytest.raises(DeadlockError, match=r"^kernel 'k': deadlock: kernel 'k' block 0 AIV pipe MTE2 waits at instr 2 "
                                            r"WaitFlag\(src=V, dst=MTE2, id=1\) and no core can proceed$"):
        interpret(aiv(body))
    with pytest.raises(DeadlockError, match=r"deadlock at cycle"):
        simulate(aiv(body), HW, trace="kernel")


# ---------------------------------------------------------------- host calls (npusim.run)


def _run(calls):
    from npusim.engine import run

    return run(calls, HW, trace="kernel")


def host_calls():
    from npusim.engine import HostWork, Launch, Memcpy, RecordEvent, Synchronize, WaitEvent

    k = aiv([copy()])
    return {
        # a str, float or negative stream was a queue of its own, and the run went on
        "stream str": ([Launch(k, "a"), Synchronize()], r"^host call 0 \(Launch\): stream 'a' is not an int >= 0$"),
        "stream float": ([Launch(k, 1.5), Synchronize()], r"stream 1\.5 is not an int >= 0"),
        "stream -1": ([Launch(k, -1), Synchronize()], r"stream -1 is not an int >= 0"),
        "memcpy stream -1": ([Memcpy(64, "h2d", -1)], r"^host call 0 \(Memcpy\): stream -1 is not an int >= 0$"),
        "event stream str": ([RecordEvent("e", "x")], r"^host call 0 \(RecordEvent\): stream 'x' is not"),
        "event name int": ([RecordEvent(3, 0), WaitEvent(3, 1)], r"^host call 0 \(RecordEvent\): name 3 is not a str$"),
        # waited on a stream nothing used, and returned
        "synchronize -5": ([Launch(k, 0), Synchronize(-5)],
                           r"^host call 1 \(Synchronize\): stream -5 is not an int >= 0 or None \(every stream\)$"),
        # AttributeError: 'NoneType' object has no attribute 'core_type'
        "launch of None": ([Launch(None, 0)], r"^host call 0 \(Launch\): kernel None is not a Kernel$"),
        # ValueError from the engine's C code ('Flows.start: nbytes nan'); 1.5 bytes ran
        "memcpy nan": ([Memcpy(float("nan"))], r"^host call 0 \(Memcpy\): nbytes nan is not an int$"),
        "memcpy 1.5": ([Memcpy(1.5)], r"nbytes 1\.5 is not an int"),
        # TypeError: '<' not supported between instances of 'str' and 'int'
        "memcpy str": ([Memcpy("8")], r"nbytes '8' is not an int"),
        "host work str": ([HostWork("1")], r"^host call 0 \(HostWork\): us '1' is not a number of microseconds$"),
        # TypeError: 'int' object is not iterable
        "calls an int": (5, r"^run: calls is 'int', expected a list of host calls"),
        "calls a str": ("abc", r"^run: calls is 'str', expected a list of host calls"),
    }


@pytest.mark.parametrize("case", list(host_calls()))
def test_a_host_call_with_a_bad_field_is_named(case):
    calls, match = host_calls()[case]
    with pytest.raises(ProgramError, match=match) as e:
        _run(calls)
    one_line(e.value)


def test_negative_flops_per_element_are_refused():
    """The kernel ran and its stats counted -16 vector flops."""
    refused(aiv([VecOp("add", 16, "fp16", 0, (256, 512), flops_per_elem=-1)]),
            r"instr 0 VecOp\(.*\): flops_per_elem -1 must be >= 0")


def _per_block(first: list, second: list) -> Kernel:
    """Two blocks, each its own program over one UB buffer: `first`, then `second`."""
    return Kernel("k", CoreType.AIV, 2, aiv=[Program(first, (UB_BUF,)), Program(second, (UB_BUF,))], gm=(X,),
                  op_type="add")


# A value of another type equal to one that passed (64.0 == 64, True == 1): each was taken
# for the instruction that passed before it and ran
EQUAL_NOT_SAME = {
    "copy nbytes": ([copy()], [copy(nbytes=64.0)], r"block 1, AIV: instr 0 Copy\(.*\): nbytes 64\.0 is a float, "
                                                   r"expected an int$"),
    "copy stride": ([copy(src_stride=1)], [copy(src_stride=True)], r"src_stride True is a bool, expected an int"),
    "flag id": ([SetFlag(Pipe.MTE2, Pipe.V, 1), WaitFlag(Pipe.MTE2, Pipe.V, 1)] * 2,
                [SetFlag(Pipe.MTE2, Pipe.V, 1), WaitFlag(Pipe.MTE2, Pipe.V, 1), SetFlag(Pipe.MTE2, Pipe.V, 1.0),
                 WaitFlag(Pipe.MTE2, Pipe.V, 1.0)], r"block 1, AIV: instr 2 SetFlag\(.*\): id 1\.0 is a float"),
    "vec pitch": ([VecOp("add", 32, "fp16", 0, (256, 512), pitches=((2, 64, 64, 64),))],
                  [VecOp("add", 32, "fp16", 0, (256, 512), pitches=((2, 64.0, 64, 64),))],
                  r"block 1, AIV: instr 0 VecOp\(.*\): pitches level \(2, 64\.0, 64, 64\): expected a tuple of ints"),
}


@pytest.mark.parametrize("case", list(EQUAL_NOT_SAME), ids=list(EQUAL_NOT_SAME))
def test_a_field_equal_to_one_that_passed_but_of_another_type_is_named(case):
    first, second, match = EQUAL_NOT_SAME[case]
    verify(_per_block(first, first), HW)
    refused(_per_block(first, second), match)


@pytest.mark.parametrize("field, value", [("block_dim", 1.0), ("workspace_bytes", 0.0), ("block_dim", True)])
def test_a_kernel_field_equal_to_one_that_ran_but_of_another_type_is_named(field, value):
    """engine.run's record of kernels verify() passed took block_dim 1.0 for the 1 that ran."""
    import attrs

    from npusim.engine import Launch, Synchronize

    k = aiv([copy()])
    _run([Launch(k), Synchronize()])
    with pytest.raises(ProgramError, match=rf"^kernel 'k': {field} {value!r} is an? \w+, expected an int$") as e:
        _run([Launch(attrs.evolve(k, **{field: value})), Synchronize()])
    one_line(e.value)


def _host_bounds():
    """A Memcpy past the device's memory, HostWork past one step's cycles: each ran."""
    from npusim.engine import HostWork, Memcpy
    from npusim.hw.checks import STEP_CYCLES_MAX

    most_us = STEP_CYCLES_MAX * 1e6 / HW.chip.freq_hz
    return {
        "memcpy 2^63": ([Memcpy(1 << 63)], rf"^host call 0 \(Memcpy\): nbytes {1 << 63} must be 1 to "
                                           rf"{HW.hbm.hbm_bytes} \(hbm\.hbm_bytes: the device memory"),
        "memcpy past hbm": ([Memcpy(HW.hbm.hbm_bytes + 1, "d2h")], rf"nbytes {HW.hbm.hbm_bytes + 1} must be 1 to"),
        "host work 1e30": ([HostWork(1e30)], r"^host call 0 \(HostWork\): us 1e\+30 must be 0 to [0-9.e+]+ "
                                             r"\(hw\.checks\.STEP_CYCLES_MAX: the 2\^40 cycles one step may take"),
        "host work past a step": ([HostWork(most_us * 1.01)], r"^host call 0 \(HostWork\): us [0-9.e+]+ must be 0 to"),
    }


@pytest.mark.parametrize("case", list(_host_bounds()))
def test_a_host_call_past_what_the_device_could_do_is_named(case):
    calls, match = _host_bounds()[case]
    with pytest.raises(ProgramError, match=match) as e:
        _run(calls)
    one_line(e.value)


def test_host_calls_at_their_bounds_run():
    from npusim.engine import HostWork, Memcpy
    from npusim.hw.checks import STEP_CYCLES_MAX

    _run([Memcpy(HW.hbm.hbm_bytes), HostWork(STEP_CYCLES_MAX * 1e6 / HW.chip.freq_hz * 0.999)])


def test_the_interpreter_refuses_a_kernel_past_its_total_steps_before_running():
    """60 blocks of 40000 instructions each (every core within the step limit) laid 2.4
    million steps out and ran them for a minute (2000 blocks: hours); now refused from the
    loop trips, before anything is unrolled."""
    from npusim.isa.walk import TooLarge

    with pytest.raises(TooLarge, match=r"^kernel 'k': its 60 cores run 2400000 instructions once unrolled, more "
                                       r"than the 2097152 the interpreter runs of one kernel \(validate --kernels "
                                       r"takes small shapes\)$"):
        interpret(aiv([Loop("i", 200, [Loop("j", 200, [Scalar(1)])])], block_dim=60))
