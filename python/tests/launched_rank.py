# launched_rank.py - one rank started by a launcher (weftrun, torchrun,
# mpirun): weft.init() reads its environment; an allreduce and an allgather
# are checked against what every rank contributed. Prints one line per rank.
import sys

import numpy as np

import weft

comm = weft.init()
size, rank = comm.size, comm.rank
expect = int(sys.argv[1]) if len(sys.argv) > 1 else size
assert size == expect, "weft.init() found %d ranks, the launcher started %d" % (size, expect)
x = np.arange(1000, dtype=np.float64) * (rank + 1)
comm.allreduce(x)
want = np.arange(1000, dtype=np.float64) * (size * (size + 1) // 2)
assert np.array_equal(x, want), "allreduce on rank %d: %r" % (rank, x[:4])
ranks = np.zeros(size, np.int32)
comm.allgather(np.array([rank], np.int32), ranks)
assert ranks.tolist() == list(range(size)), ranks
print("weft rank %d of %d ok, local rank %d" % (rank, size, comm.local_rank), flush=True)
comm.destroy()
