#!/usr/bin/env python3
"""switch_points.py - tables from tools/switch_points.sh's runs.txt files.

    python3 tools/switch_points.py OUT/runs.txt [OUT2/runs.txt ...]

For each pair of forced algorithms (phase A and C) a table of times in
microseconds, one cell per size with every run's figure; for phase B a table
per transport: the best Open MPI row's time over weft's at each size (above
1: weft ahead; a range over the runs; bold below 1)."""
import collections
import re
import sys

PAIRS = [  # (title, collective, tags, rank counts)
    ("one-round exchange / recursive doubling, shm", "allreduce", ["ex-exchange", "ex-rd"],
     (3, 4, 8, 16)),
    ("recursive doubling / ring, shm", "allreduce", ["rr-rd", "rr-ring"], (2, 4, 8, 16)),
    ("recursive doubling / ring, tcp", "allreduce", ["rrt-rd", "rrt-ring"], (4, 16)),
    ("broadcast: flat / chain / default without flat", "bcast", ["bc-flat", "bc-chain", "bc-auto"],
     (4, 8, 16)),
    ("allgather: ring / pairwise, shm", "allgather", ["ag-ring", "ag-pairwise"], (4, 8, 16)),
    ("shm single copy: off / on", "bcast", ["cma-off", "cma-on"], (2, 4)),
    ("shm single copy: off / on", "alltoall", ["cma-off", "cma-on"], (2, 4)),
    ("one-way stream limit (WEFT_SHM_CMA_STREAM_BYTES), shm", "bcast",
     ["st-0", "st-1M", "st-2M", "st-4M", "st-8M", "ompi-vader", "ompi-vader-nommap"], (2, 4, 8)),
    ("one-way stream limit (WEFT_SHM_CMA_STREAM_BYTES), shm", "gather",
     ["st-0", "st-1M", "st-2M", "st-4M", "st-8M"], (2,)),
    ("chain broadcast's pipeline chunk (WEFT_CHUNK_BYTES), shm", "bcast",
     ["pc-shm-32K", "pc-shm-64K", "pc-shm-128K", "pc-shm-256K", "ompi-vader"], (8, 16)),
    ("chain broadcast's pipeline chunk (WEFT_CHUNK_BYTES), tcp", "bcast",
     ["pc-tcp-32K", "pc-tcp-64K", "pc-tcp-128K", "pc-tcp-256K", "ompi-tcp-nommap"], (8, 16)),
    ("shm single copy: off / on, with Open MPI", "allgather",
     ["cma-off", "cma-on", "ompi-vader-nommap"], (2,)),
    ("allgather: ring / Bruck, shm", "allgather", ["ag-old-shm", "ag-bruck-shm"], (8, 16)),
    ("allgather: ring / Bruck, tcp", "allgather", ["ag-old-tcp", "ag-bruck-tcp"], (8, 16)),
    ("reduce_scatter: ring / recursive doubling / halving, shm", "reduce_scatter",
     ["rs-old-shm", "rs-rd-shm", "rs-halving-shm"], (8, 16)),
    ("reduce_scatter: ring / recursive doubling / halving, tcp", "reduce_scatter",
     ["rs-old-tcp", "rs-rd-tcp", "rs-halving-tcp"], (8, 16)),
]
PEERS = {"shm": ["weft-shm", "ompi-vader", "ompi-vader-nommap"],
         "tcp": ["weft-tcp", "ompi-tcp-nommap"]}
COLLS = ["allreduce", "bcast", "allgather", "reduce_scatter", "alltoall"]
SIZES = [8, 32768, 131072, 524288, 2097152, 8388608, 33554432, 67108864]


def load(path):
    """(tag, ranks, collective) -> [{bytes: time_us}], one dict per run."""
    runs = collections.defaultdict(list)
    cur = None
    with open(path) as f:
        for line in f:
            m = re.match(r"### tag=(\S+) np=(\d+) coll=(\S+)", line)
            if m:
                cur = {}
                runs[(m[1], int(m[2]), m[3])].append(cur)
                continue
            fields = re.sub(r"^\[ *0\]", "", line).split()
            if cur is not None and len(fields) == 7 and fields[0].isdigit() and fields[6] == "ok":
                cur[int(fields[0])] = float(fields[3])
    return runs


def times(files, tag, np, coll, size):
    return [d[size] for r in files for d in r.get((tag, np, coll), []) if size in d]


def fmt(v):
    return "%.0f" % v if v >= 100 else "%.1f" % v


def pair_tables(files):
    for title, coll, tags, nps in PAIRS:
        for np in nps:
            sizes = sorted({b for r in files for t in tags for d in r.get((t, np, coll), [])
                            for b in d})
            if not sizes:
                continue
            print(f"\n{title}, {np} ranks, {coll} (us; {' / '.join(tags)})\n")
            print("| bytes | " + " | ".join(tags) + " |")
            print("|---:|" + "---:|" * len(tags))
            for b in sizes:
                cells = []
                for t in tags:
                    v = times(files, t, np, coll, b)
                    lo, hi = (fmt(min(v)), fmt(max(v))) if v else ("-", "-")
                    cells.append(lo if lo == hi else f"{lo}-{hi}")
                print(f"| {b} | " + " | ".join(cells) + " |")


def peer_tables(files):
    rows = []
    for tr, peers in PEERS.items():
        for coll in COLLS:
            for np in (2, 4, 8, 16):
                cells = []
                for b in SIZES:
                    ratios = []
                    for r in files:
                        w = [d[b] for d in r.get((peers[0], np, coll), []) if b in d]
                        o = [d[b] for p in peers[1:] for d in r.get((p, np, coll), []) if b in d]
                        if w and o:
                            ratios.append(min(o) / w[0])
                    if not ratios:
                        cells.append("-")
                        continue
                    lo, hi = min(ratios), max(ratios)
                    s = f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}"
                    cells.append(f"**{s}**" if hi < 1 else s)
                if any(c != "-" for c in cells):
                    rows.append(f"| {tr} {coll} {np} | " + " | ".join(cells) + " |")
    if rows:
        print("\nbest Open MPI row's time / weft's (above 1: weft ahead)\n")
        print("| transport, collective, ranks | 8 B | 32 KiB | 128 KiB | 512 KiB | 2 MiB |"
              " 8 MiB | 32 MiB | 64 MiB |")
        print("|---|" + "---:|" * 8)
        print("\n".join(rows))


def main(paths):
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    files = [load(p) for p in paths]
    pair_tables(files)
    peer_tables(files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
