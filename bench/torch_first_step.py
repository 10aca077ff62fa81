"""Peer of `dtrain train`'s "first step done N s after start": the seconds a
transformers user waits for the first training step of a GPT-2 from scratch.
From the process's start (the imports of torch and transformers included):
GPT2LMHeadModel(GPT2Config(...)) with transformers' own initialisation, AdamW
(fused where PyTorch has it on the CPU), one step (forward with labels,
backward, optimizer step) on random tokens.
Usage: python bench/torch_first_step.py [--model gpt2|gpt2-medium|gpt-micro] [--batch 4] [--seq 64] [--threads 2]
gpt-micro: dtrain's 2 layers, 2 heads, 64 wide, 64 positions, vocabulary 512.
Prints one JSON line: import_s, model_s (model and optimizer built), first_step_s (the step
done), step_s (the step alone), peak_rss_mib."""
import os


def since_start():
    """Seconds since this process started (/proc: the kernel's start time, 10 ms ticks)."""
    stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    start = int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return float(open("/proc/uptime").read().split()[0]) - start


import argparse, json, resource  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", choices=("gpt2", "gpt2-medium", "gpt-micro"), default="gpt2")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
t_import = since_start()
L, H, C, P, V = {"gpt2": (12, 12, 768, 1024, 50257), "gpt2-medium": (24, 16, 1024, 1024, 50257),
                 "gpt-micro": (2, 2, 64, 64, 512)}[a.model]
m = GPT2LMHeadModel(GPT2Config(n_layer=L, n_head=H, n_embd=C, n_positions=P, vocab_size=V))
fused = {"fused": True} if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4) else {}
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, **fused)
t_model = since_start()
idx = torch.randint(0, V, (a.batch, a.seq))
loss = m(idx, labels=idx).loss
loss.backward()
opt.step()
t_first = since_start()
print(json.dumps({"torch": torch.__version__, "model": a.model, "batch": a.batch, "seq": a.seq,
                  "threads": a.threads, "import_s": round(t_import, 2), "model_s": round(t_model, 2),
                  "first_step_s": round(t_first, 2), "step_s": round(t_first - t_model, 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
