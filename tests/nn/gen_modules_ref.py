# Reference numbers for tests/nn/test_modules.c (run: /usr/bin/python3 gen_modules_ref.py).
# PyTorch 1.13 (Debian), CPU, one thread. Two models written as the C test
# writes them with dtrain's containers: a residual block inside a small
# ConvNet, and a language-model head tied to its embedding. Weights are
# PyTorch's own initialisation after torch.manual_seed (the C test redraws
# them with dt_model_init_torch); inputs are formulas the test repeats.
# Not a test dependency: its output is pasted into the test.
import torch, torch.nn as nn
torch.set_num_threads(1)

class Block(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.conv1 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        s.bn1 = nn.BatchNorm2d(c)
        s.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        s.bn2 = nn.BatchNorm2d(c)
    def forward(s, x):
        out = torch.relu(s.bn1(s.conv1(x)))
        out = s.bn2(s.conv2(out))
        return torch.relu(out + x)

class ResNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.stem = nn.Conv2d(2, 8, 3, 1, 1)
        s.block = Block(8)
        s.fc = nn.Linear(8 * 4 * 4, 3)
    def forward(s, x):
        return s.fc(s.block(s.stem(x)).flatten(1))

class Tied(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(10, 6)
        s.body = nn.Linear(6, 6)
        s.lm_head = nn.Linear(6, 10, bias=False)
        s.lm_head.weight = s.wte.weight
    def forward(s, idx):
        return s.lm_head(torch.nn.functional.gelu(s.body(s.wte(idx))))

def hexs(t):
    return ", ".join(float.hex(v) for v in t.flatten().tolist())

torch.manual_seed(5)
m = ResNet()
print("resnet keys", list(m.state_dict().keys()))
x = torch.tensor([((i * 5) % 23 - 11) / 16.0 for i in range(2 * 2 * 16)]).reshape(2, 2, 4, 4)
y = torch.tensor([0, 2])
loss = nn.functional.cross_entropy(m(x), y)
loss.backward()
print("resnet loss", float.hex(loss.item()))
print("stem.weight.grad[0:6]", hexs(m.stem.weight.grad.flatten()[0:6]))
print("block.conv1.weight.grad[0:6]", hexs(m.block.conv1.weight.grad.flatten()[0:6]))
print("block.bn2.weight.grad", hexs(m.block.bn2.weight.grad))
print("fc.bias.grad", hexs(m.fc.bias.grad))
print("block.bn1.running_mean[0:4]", hexs(m.block.bn1.running_mean[0:4]))

torch.manual_seed(3)
t = Tied()
print("tied keys", list(t.state_dict().keys()))
print("tied params", [n for n, _ in t.named_parameters()])
idx = torch.tensor([[1, 4, 9], [0, 4, 7]])
tgt = torch.tensor([4, 9, 2, 3, 3, 0])
logits = t(idx)
loss = nn.functional.cross_entropy(logits.reshape(6, 10), tgt)
loss.backward()
print("tied loss", float.hex(loss.item()))
print("wte.weight.grad", hexs(t.wte.weight.grad))
print("body.bias.grad", hexs(t.body.bias.grad))
