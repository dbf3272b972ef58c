"""rackbench's torch.distributed benchmark: collectives (all_reduce, all_gather) or a small synthetic DDP training
loop, one process per rank, started by mpirun (or torchrun).

    mpirun ... python3 -u torch_dist.py --op all_reduce --master 10.0.0.1 --port 29500 --backend gloo \\
        --min-bytes 8 --max-bytes 4M --factor 4 --warmup 2 --iters 10
    mpirun ... python3 -u torch_dist.py --op ddp --master 10.0.0.1 --port 29500 --batch-size 32 --steps 20

Ranks come from Open MPI's environment (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK) or torchrun's (RANK, WORLD_SIZE,
LOCAL_RANK); rank 0 listens on --master:--port for the others (init_method tcp://). gloo runs on CPUs; nccl on the
GPU of each rank's local rank.

Collectives are printed by rank 0 in nccl-tests' table format, so rackbench's nccl-tests parser reads them: one row
per message size with time (us per operation, the mean over --iters), algbw (size / time, GB/s) and busbw (algbw x
2(n-1)/n for all_reduce, x (n-1)/n for all_gather, as nccl-tests defines them) and #wrong (elements that differ from
the expected result: every rank contributes known values). all_reduce is in place (its out-of-place columns read
N/A), all_gather out of place (its in-place columns read N/A). The DDP loop prints
``Total img/sec on N CPU(s): X`` (or GPU(s)).

Pairwise (``--pairs PLAN``, a JSON file {"names": [node per rank], "rounds": [[[rank, rank], ...], ...]}): one rank
per node; every pair gets its own 2-rank process group (all ranks create all groups, in the same order, as
torch.distributed requires), and the pairs of a round run their collective at once, each timed within its own group.
A world barrier separates the rounds, so a node in two pairs (pass 2's shared good partner) is never in two tests at
once. Rank 0 then prints each pair's table after a ``#rackbench-pair {"round": R, "nodes": [A, B]}`` line, and
``#rackbench-pairs {"pairs": N}`` last.
"""

import argparse
import gc
import json
import os
import socket
import sys
import time
import traceback


def size_arg(text):
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip().upper()
    unit = text[-1] if text and text[-1] in "KMG" else ""
    return int(text[: len(text) - len(unit)]) * units[unit]


def env_int(*names):
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    raise SystemExit(f"no rank in the environment ({', '.join(names)}): start this under mpirun or torchrun")


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=("all_reduce", "all_gather", "ddp"), required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--min-bytes", type=size_arg, default=8)
    parser.add_argument("--max-bytes", type=size_arg, default=4 * 1024**2)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--pairs", help="a JSON plan of pairs in rounds: every pair runs its own 2-rank collective")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK")
    size = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")
    local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")
    if args.backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, init_method=f"tcp://{args.master}:{args.port}", rank=rank, world_size=size)
    try:
        hosts = [None] * size
        dist.all_gather_object(hosts, (rank, socket.gethostname(), os.getpid(), str(device)))
        if args.op == "ddp":
            ddp(args, torch, dist, rank, size, device)
        elif args.pairs:
            pairwise(args, torch, dist, rank, device, hosts)
        else:
            collectives(args, torch, dist, rank, size, device, hosts)
        gc.collect()  # DDP's reducer (in reference cycles) goes while its process group still stands
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PAIR_HEADER = "#rackbench-pair "
PAIRS_FOOTER = "#rackbench-pairs "


def table_header(out, args, torch, size, hosts):
    out.write(
        f"# rackbench torch_dist {args.op} backend {args.backend} torch {torch.__version__} ranks {size} "
        f"minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.factor}(factor) "
        f"warmup iters: {args.warmup} iters: {args.iters}\n#\n# Using devices\n"
    )
    for r, host, pid, dev in hosts:
        out.write(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10} device  0 [{dev}] {dev.upper()}\n")
    out.write(f"#\n#{'out-of-place':>62}{'in-place':>34}\n")
    placement = "    time   algbw   busbw #wrong"
    out.write(f"#{'size':>12}{'count':>14}{'type':>10}{'redop':>8}{'root':>8} {placement} {placement}\n")
    units = "    (us)  (GB/s)  (GB/s)       "
    out.write(f"#{'(B)':>12}{'(elements)':>14}{'':26} {units} {units}\n")


def table_row(args, count, seconds, wrong, factor):
    algbw = count * 4 / seconds / 1e9
    # A space before every field, as nccl-tests prints them: a time past 1e6 us still stands apart from the column
    # before it (a bare 9-wide field ran into it: "N/A1131798.9").
    measured = f" {seconds * 1e6:8.1f} {algbw:7.2f} {algbw * factor:7.2f} {wrong:6d}"
    missing = f" {'N/A':>8} {'N/A':>7} {'N/A':>7} {'N/A':>6}"
    placed = (missing + measured) if args.op == "all_reduce" else (measured + missing)
    redop = "sum" if args.op == "all_reduce" else "none"
    return f"{count * 4:13d}{count:14d}{'float':>10}{redop:>8}{-1:8d}{placed}\n", algbw * factor


def table_footer(out, busbw):
    out.write("# Out of bounds values : 0 OK\n")
    out.write(f"# Avg bus bandwidth    : {sum(busbw) / len(busbw) if busbw else 0:g} \n#\n")


def measure(args, torch, dist, rank, size, device, emit, group=None):
    """Every message size's collective among ``size`` ranks (the world, or ``group`` with ``rank`` its rank in it):
    ``emit((count, seconds, wrong, factor))`` per size, the slowest rank's time as nccl-tests reports it."""
    nbytes = max(args.min_bytes, 4 * size)
    while nbytes <= args.max_bytes:
        count = nbytes // 4  # float32 elements in the whole message
        if args.op == "all_reduce":
            run, check, factor = all_reduce(torch, dist, rank, size, count, device, group)
        else:
            count -= count % size
            run, check, factor = all_gather(torch, dist, rank, size, count, device, group)
        for _ in range(args.warmup):
            run()
        sync(torch, device)
        dist.barrier(group=group)
        started = time.perf_counter()
        for _ in range(args.iters):
            run()
        sync(torch, device)
        seconds = (time.perf_counter() - started) / args.iters
        elapsed = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        wrong = torch.tensor([check()], dtype=torch.int64)
        dist.all_reduce(wrong, group=group)
        emit((count, elapsed.item(), int(wrong.item()), factor))
        nbytes *= args.factor


def collectives(args, torch, dist, rank, size, device, hosts):
    out = sys.stdout
    if rank == 0:
        table_header(out, args, torch, size, hosts)
    busbw = []

    def emit(row):
        line, bw = table_row(args, *row)
        busbw.append(bw)
        if rank == 0:
            out.write(line)
            out.flush()

    measure(args, torch, dist, rank, size, device, emit)
    if rank == 0:
        table_footer(out, busbw)
        out.flush()


def pairwise(args, torch, dist, rank, device, hosts):
    """Each pair of the plan's rounds runs the collective in its own 2-rank group; see the module docstring."""
    with open(args.pairs, encoding="utf-8") as plan_file:
        plan = json.load(plan_file)
    names, rounds = plan["names"], [[tuple(pair) for pair in pairs] for pairs in plan["rounds"]]
    groups = {pair: dist.new_group(list(pair)) for pairs in rounds for pair in pairs}
    mine = []  # (round, pair, rows) of the pairs this rank leads (the pair's first rank)
    for number, pairs in enumerate(rounds):
        dist.barrier()
        for pair in pairs:
            if rank not in pair:
                continue
            rows: list = []
            measure(args, torch, dist, pair.index(rank), 2, device, rows.append, group=groups[pair])
            if rank == pair[0]:
                mine.append((number, pair, rows))
    dist.barrier()
    everyone: list = [None] * len(hosts)
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return
    out = sys.stdout
    done = sorted(found for each in everyone for found in each)
    for number, (a, b), rows in done:
        out.write(PAIR_HEADER + json.dumps({"round": number, "nodes": [names[a], names[b]]}) + "\n")
        table_header(out, args, torch, 2, [hosts[a], hosts[b]])
        busbw = []
        for count, seconds, wrong, factor in rows:
            line, bw = table_row(args, count, seconds, wrong, factor)
            busbw.append(bw)
            out.write(line)
        table_footer(out, busbw)
    out.write(PAIRS_FOOTER + json.dumps({"pairs": len(done)}) + "\n")
    out.flush()


def all_reduce(torch, dist, rank, size, count, device, group=None):
    """Each rank holds rank+1 everywhere; after the first sum every element is n(n+1)/2, then it keeps growing by
    the factor n per further all_reduce, so the check resets the buffer before a last, checked operation."""
    buf = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)

    def run():
        dist.all_reduce(buf, group=group)

    def check():
        buf.fill_(float(rank + 1))
        dist.all_reduce(buf, group=group)
        return int((buf != float(size * (size + 1) // 2)).sum().item())

    return run, check, 2.0 * (size - 1) / size


def all_gather(torch, dist, rank, size, count, device, group=None):
    """Each rank contributes count/n elements of value rank+1; the gathered tensor's chunk r must hold r+1."""
    chunk = count // size
    mine = torch.full((chunk,), float(rank + 1), dtype=torch.float32, device=device)
    gathered = torch.empty((count,), dtype=torch.float32, device=device)

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13

    def run():
        gather(gathered, mine, group=group)

    def check():
        gathered.zero_()
        run()
        expected = torch.arange(1, size + 1, dtype=torch.float32, device=device).repeat_interleave(chunk)
        return int((gathered != expected).sum().item())

    return run, check, (size - 1) / size


def ddp(args, torch, dist, rank, size, device):
    """A small CNN on synthetic 3x32x32 images: forward, backward (DDP averages the gradients) and an SGD step."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(rank)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    ).to(device)
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)

    def step():
        optimizer.zero_grad()
        loss_fn(wrapped(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup_steps):
        step()
    sync(torch, device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(torch, device)
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        total = size * args.batch_size * args.steps / elapsed.item()
        kind = "GPU" if device.type == "cuda" else "CPU"
        sys.stdout.write(f"Img/sec per {kind}: {total / size:.1f}\n")
        sys.stdout.write(f"Total img/sec on {size} {kind}(s): {total:.1f}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # argparse's refusals
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - reported here, then the same hard exit
        traceback.print_exc()
        code = 1
    # Results are printed and the process group is destroyed: leave without the interpreter's teardown, where a
    # gloo thread of DDP's reducer outliving its group aborted a rank (signal 6, "terminate called without an active
    # exception") after the results had been written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
