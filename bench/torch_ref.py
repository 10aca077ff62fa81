"""Shared by the PyTorch reference scripts in bench/ (reference only, never a
build dependency): the ConvNet of dtrain's model zoo, built in the same
module order (so torch.manual_seed(N) gives the weights `dtrain train --seed
N` starts from), and a reader for the Fashion-MNIST IDX files."""
import gzip, os
import numpy as np
import torch
import torch.nn as nn

FASHION_DIR = os.environ.get("DT_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).flatten(1))


def idx(path):
    """An IDX file (plain or .gz) as a numpy array."""
    b = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)


def fashion(split):
    """(images [N,1,28,28] float in [0,1] as ToTensor gives, labels [N] int64)
    of split "train" or "t10k"."""
    x = torch.from_numpy(idx(f"{FASHION_DIR}/{split}-images-idx3-ubyte.gz").copy()).float().div_(255).unsqueeze(1)
    y = torch.from_numpy(idx(f"{FASHION_DIR}/{split}-labels-idx1-ubyte.gz").astype(np.int64))
    return x, y
