# Reference numbers for tests/nn/test_nn.c (run: /usr/bin/python3 gen_ref.py).
# PyTorch 1.13.1 (Debian), CPU. The ConvNet of models/convnet.c with every
# parameter filled by a formula that the C test repeats (dyadic rationals,
# exact in float32), input likewise; train mode, batch 2.
import torch, torch.nn as nn
torch.set_num_threads(1)
class ConvNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        s.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        s.fc = nn.Linear(7 * 7 * 32, 10)
    def forward(s, x):
        return s.fc(s.layer2(s.layer1(x)).reshape(x.shape[0], -1))
m = ConvNet()
print("keys", list(m.state_dict().keys()))
with torch.no_grad():
    for k, (name, p) in enumerate(m.named_parameters()):
        n = p.numel()
        p.copy_(torch.tensor([((i * 7 + k * 3) % 17 - 8) / 64.0 for i in range(n)]).reshape(p.shape))
x = torch.tensor([((i * 5) % 23 - 11) / 16.0 for i in range(2 * 784)]).reshape(2, 1, 28, 28)
y = torch.tensor([3, 7])
out = m(x)
loss = nn.functional.cross_entropy(out, y)
loss.backward()
print("logits0", [float.hex(v) for v in out[0].tolist()])
print("loss", float.hex(loss.item()))
print("fc.bias.grad", [float.hex(v) for v in m.fc.bias.grad.tolist()])
print("layer1.0.weight.grad[0:4]", [float.hex(v) for v in m.layer1[0].weight.grad.flatten()[0:4].tolist()])
print("layer1.1.running_mean[0:2]", [float.hex(v) for v in m.layer1[1].running_mean[0:2].tolist()])
print("layer1.1.running_var[0:2]", [float.hex(v) for v in m.layer1[1].running_var[0:2].tolist()])
