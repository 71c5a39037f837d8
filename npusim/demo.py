"""The manual's hand-built kernel: a tiled, double-buffered vector add on every AIV core.

`npusim demo` runs it. docs/kernel-by-hand.md shows this file's code; a test checks
that the two agree and that the example runs.
"""

from npusim.engine import simulate
from npusim.hw import load_hw
from npusim.isa import (
    Buffer, Copy, CoreType, GmTensor, Kernel, Loop, Mem, Pipe, Program, SetFlag, VecOp, WaitFlag, addr,
)


def vector_add(hw, tiles_per_block=1000, tile=4096, dtype_bytes=2):
    """z = x + y over fp16 vectors, one contiguous chunk per AIV core, in tiles of
    `tile` elements. Two UB buffer sets (ping, pong) let MTE2 load tile i+1 while
    V adds tile i and MTE3 stores tile i-1; flags order the three pipes."""
    blocks = hw.aiv_count
    tb = tile * dtype_bytes                      # bytes per tile
    chunk = tiles_per_block * tb                 # bytes per block
    x, y, z = 0, blocks * chunk, 2 * blocks * chunk

    def gm(base, ping):                          # this block's tile 2*i + ping
        return addr(base + ping * tb, block=chunk, i=2 * tb)

    body = []
    for ping in (0, 1):
        ub_x, ub_y, ub_z = [(3 * ping + j) * tb for j in range(3)]
        body += [
            WaitFlag(Pipe.MTE3, Pipe.MTE2, ping),          # buffers free again
            Copy(Mem.GM, Mem.UB, gm(x, ping), ub_x, tb),
            Copy(Mem.GM, Mem.UB, gm(y, ping), ub_y, tb),
            SetFlag(Pipe.MTE2, Pipe.V, ping),
            WaitFlag(Pipe.MTE2, Pipe.V, ping),             # inputs arrived
            VecOp("add", tile, "fp16", ub_z, (ub_x, ub_y)),
            SetFlag(Pipe.V, Pipe.MTE3, ping),
            WaitFlag(Pipe.V, Pipe.MTE3, ping),             # result ready
            Copy(Mem.UB, Mem.GM, ub_z, gm(z, ping), tb),
            SetFlag(Pipe.MTE3, Pipe.MTE2, ping),
        ]
    program = Program(
        [SetFlag(Pipe.MTE3, Pipe.MTE2, 0), SetFlag(Pipe.MTE3, Pipe.MTE2, 1),
         Loop("i", tiles_per_block // 2, body),
         WaitFlag(Pipe.MTE3, Pipe.MTE2, 0), WaitFlag(Pipe.MTE3, Pipe.MTE2, 1)],
        buffers=[Buffer("ping", Mem.UB, 0, 3 * tb), Buffer("pong", Mem.UB, 3 * tb, 3 * tb)],
    )
    tensors = [GmTensor(name, base, blocks * chunk) for name, base in (("x", x), ("y", y), ("z", z))]
    return Kernel("vector_add", CoreType.AIV, blocks, aiv=[program], gm=tensors, op_type="add")


def main(hw_name="ascend910b2"):
    hw = load_hw(hw_name)
    result = simulate(vector_add(hw), hw)
    k = result.kernels[0]
    s = k.stats
    seconds = hw.us(k.cycles) * 1e-6
    print(f"{k.name}: {k.cycles:.0f} cycles = {hw.us(k.cycles):.1f} us on {hw.name}")
    print(f"HBM traffic {(s.hbm_read_bytes + s.hbm_write_bytes) / 1e9:.3f} GB, "
          f"achieved {(s.gm_read_bytes + s.gm_write_bytes) / seconds / 1e12:.2f} TB/s "
          f"of {hw.hbm.peak_bw_bytes_per_s / 1e12:.2f} TB/s peak")
    for pipe in ("AIV.MTE2", "AIV.V", "AIV.MTE3"):
        print(f"  {pipe:9s} busy {100 * s.utilisation(pipe):5.1f}%")
    return result


if __name__ == "__main__":
    main()
