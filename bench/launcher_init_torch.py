# PyTorch's side of scripts/bench_launcher.sh: a torchrun worker that joins with
# torch.distributed.init_process_group("gloo") and prints when it got through (ns, wall clock).
import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"init_done_ns {time.time_ns()} rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
