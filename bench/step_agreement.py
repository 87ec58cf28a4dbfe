"""The cost of the packed loaders' step agreement (python/feedline/_ranks.py): one gloo
all-reduce (MAX) of one int per step, between N local processes on loopback.

    /usr/bin/python3 bench/step_agreement.py 2"""
import datetime
import os
import subprocess
import sys
import time


def rank_main():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    flag = torch.zeros(1, dtype=torch.int32)
    for _ in range(100):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    steps = 2000
    t0 = time.perf_counter()
    for _ in range(steps):
        flag.fill_(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        flag.item()
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks: {(time.perf_counter() - t0) / steps * 1e6:.0f} us "
              "per step agreement")
    dist.destroy_process_group()


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank"],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(world)]
    for p in procs:
        p.wait()


if __name__ == "__main__":
    rank_main() if "--rank" in sys.argv else main()
