# Reference numbers for tests/optim/test_optim.c (run: /usr/bin/python3 gen_ref.py).
# torch 1.13 CPU (AVX2), default single-tensor paths. Inputs are dyadic
# rationals, exact in float32, so C and Python start from the same bits.
import torch
def P(i): return ((i * 37) % 101 - 50) / 64.0
def G(i, t): return ((i * 53 + t * 17) % 97 - 48) / 128.0
sizes = [13, 11]
def run(make):
    ps = []; off = 0
    for n in sizes:
        ps.append(torch.tensor([P(off + i) for i in range(n)], dtype=torch.float32, requires_grad=True)); off += n
    opt = make(ps)
    for t in range(3):
        off = 0
        for p, n in zip(ps, sizes):
            p.grad = torch.tensor([G(off + i, t) for i in range(n)], dtype=torch.float32); off += n
        opt.step()
    return torch.cat([p.detach() for p in ps]).tolist()
cfgs = {
 "sgd_plain": lambda ps: torch.optim.SGD(ps, lr=0.1),
 "sgd_mom_wd_damp": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.05),
 "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
 "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
 "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}
for name, mk in cfgs.items():
    out = run(mk)
    print("static const float ref_%s[24] = {" % name)
    print(",\n".join("    " + ", ".join(float.hex(v) + "f" for v in out[i:i+4]) for i in range(0, 24, 4)) + "};")
# clip_grad_norm_ on the step-0 gradients with max_norm 0.5
gs = [torch.tensor([G(i, 0) for i in range(24)], dtype=torch.float32)]
ps = [torch.zeros(24, requires_grad=True)]; ps[0].grad = gs[0].clone()
tn = torch.nn.utils.clip_grad_norm_(ps, 0.5)
print("static const float ref_clip_norm = %sf;" % float.hex(tn.item()))
print("static const float ref_clip[24] = {")
out = ps[0].grad.tolist()
print(",\n".join("    " + ", ".join(float.hex(v) + "f" for v in out[i:i+4]) for i in range(0, 24, 4)) + "};")
