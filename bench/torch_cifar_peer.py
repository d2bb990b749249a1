#!/usr/bin/python3
"""PyTorch reference for issue 19's workloads, the same models and recipes kiln runs.

  bench/torch_cifar_peer.py resnet DIR   ResNet-8 on CIFAR-10 binary files in DIR
  bench/torch_cifar_peer.py table DIR    an MLP with BatchNorm1d on DIR/train.csv, DIR/test.csv
  bench/torch_cifar_peer.py resnet DIR --check-checkpoint FILE
                                         loads a kiln checkpoint into the same module with
                                         strict=True and prints its test accuracy, with the
                                         test split normalised as the checkpoint records

ResNet-8 is He et al.'s CIFAR layout with n = 1 (6n + 2 = 8 weighted layers: a 3x3 conv to 16
channels, three stages of one basic block at 16, 32 and 64 channels, the last two with stride 2,
global average pooling, a linear layer), with 1x1 conv + BatchNorm projection shortcuts where
the shape changes (their option B). Recipe: SGD Nesterov momentum 0.9, weight decay 5e-4,
OneCycleLR with max_lr 0.1 (momentum cycled, PyTorch's defaults), label smoothing 0.1, batch
128, per-channel normalisation with the training set's statistics; --augment adds random crops
(padding 4) and horizontal flips. The table's MLP: Linear-BatchNorm1d-ReLU twice (256, 128),
then Linear to the classes; Adam 1e-3, batch 256, features standardised with the training
split's mean and std.

Data are read with numpy (no torchvision), kept as float tensors, batched by slicing a
per-epoch permutation. Run with the system python (Debian's python3-torch 1.13).
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_cifar(d):
    def read(names):
        raw = b"".join(open(os.path.join(d, n), "rb").read() for n in names)
        rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3073)
        return rec[:, 1:].reshape(-1, 3, 32, 32), rec[:, 0].astype(np.int64)

    train = sorted(n for n in os.listdir(d) if n.startswith("data_batch_"))
    xtr, ytr = read(train)
    xte, yte = read(["test_batch.bin"])
    xtr = torch.from_numpy(xtr.astype(np.float32) / 255.0)
    xte = torch.from_numpy(xte.astype(np.float32) / 255.0)
    mean = xtr.mean(dim=(0, 2, 3), keepdim=True)
    std = xtr.std(dim=(0, 2, 3), unbiased=False, keepdim=True)
    print(f"# per-channel mean {mean.flatten().tolist()} std {std.flatten().tolist()}")
    return ((xtr - mean) / std, torch.from_numpy(ytr), (xte - mean) / std, torch.from_numpy(yte))


def load_table(d):
    def read(name):
        a = np.loadtxt(os.path.join(d, name), delimiter=",", skiprows=1, dtype=np.float64)
        return a[:, :-1], a[:, -1].astype(np.int64)

    xtr, ytr = read("train.csv")
    xte, yte = read("test.csv")
    mean, std = xtr.mean(axis=0), xtr.std(axis=0)
    std[std == 0] = 1
    f = lambda x: torch.from_numpy(((x - mean) / std).astype(np.float32))
    return f(xtr), torch.from_numpy(ytr), f(xte), torch.from_numpy(yte)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet8(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def table_mlp(features, classes=10):
    return nn.Sequential(nn.Linear(features, 256), nn.BatchNorm1d(256), nn.ReLU(),
                         nn.Linear(256, 128), nn.BatchNorm1d(128), nn.ReLU(),
                         nn.Linear(128, classes))


def augment(x, g):
    """Random crop with padding 4 and horizontal flip, per sample."""
    n = x.shape[0]
    padded = F.pad(x, (4, 4, 4, 4))
    dy = torch.randint(0, 9, (n,), generator=g)
    dx = torch.randint(0, 9, (n,), generator=g)
    flip = torch.rand(n, generator=g) < 0.5
    out = torch.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
        out[i] = crop.flip(2) if flip[i] else crop
    return out


@torch.no_grad()
def accuracy(net, x, y, bs=1000):
    net.eval()
    correct = sum((net(x[i:i + bs]).argmax(1) == y[i:i + bs]).sum().item()
                  for i in range(0, x.shape[0], bs))
    net.train()
    return 100.0 * correct / x.shape[0]


def read_safetensors(path):
    """The tensors of a safetensors file, and its __metadata__ strings."""
    dtypes = {"F32": "<f4", "I32": "<i4", "U8": "u1", "I64": "<i8", "U64": "<u8"}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=dtypes[info["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out, header.get("__metadata__", {})


def kiln_norm(text):
    """kiln's "kiln.norm" metadata: "scale,mean,std[;means;stds[;features]]"."""
    sections = text.split(";")
    scale, mean, std = (float(v) for v in sections[0].split(","))
    if len(sections) >= 3:
        mean = [float(v) for v in sections[1].split(",")]
        std = [float(v) for v in sections[2].split(",")]
    else:
        mean, std = [mean], [std]
    return scale, torch.tensor(mean), torch.tensor(std)


def raw_test_split(workload, d):
    """The test split as stored (bytes for images, numbers for a table), before normalisation."""
    if workload == "resnet":
        rec = np.frombuffer(open(os.path.join(d, "test_batch.bin"), "rb").read(), dtype=np.uint8)
        rec = rec.reshape(-1, 3073)
        x = torch.from_numpy(rec[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32))
        return x, torch.from_numpy(rec[:, 0].astype(np.int64))
    a = np.loadtxt(os.path.join(d, "test.csv"), delimiter=",", skiprows=1, dtype=np.float64)
    return torch.from_numpy(a[:, :-1].astype(np.float32)), torch.from_numpy(a[:, -1].astype(np.int64))


def normalise_as_kiln(x, norm):
    """(raw * scale - mean[c]) / std[c], per channel (images) or per feature (tables)."""
    scale, mean, std = norm
    shape = (1, -1, 1, 1) if x.dim() == 4 else (1, -1)
    if mean.numel() == 1:
        shape = (1,) * x.dim()
    return (x * scale - mean.reshape(shape)) / std.reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["resnet", "table"])
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--augment", action="store_true")
    ap.add_argument("--check-checkpoint", default=None)
    ap.add_argument("--channels-last", action="store_true",
                    help="resnet: the model and each batch in torch.channels_last (NHWC)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: torch.autocast(bfloat16) around the forward and loss")
    ap.add_argument("--infer-only", action="store_true",
                    help="resnet: time inference of an untrained model on the test batch "
                         "(as `kiln-bench infer`), no training")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    if a.check_checkpoint:
        # Only the checkpoint: its weights and buffers, and the normalisation it records.
        tensors, metadata = read_safetensors(a.check_checkpoint)
        xte, yte = raw_test_split(a.workload, a.data)
        net = ResNet8() if a.workload == "resnet" else table_mlp(xte.shape[1])
        state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
        net.load_state_dict(state, strict=True)
        xte = normalise_as_kiln(xte, kiln_norm(metadata["kiln.norm"]))
        correct = round(accuracy(net, xte, yte) * xte.shape[0] / 100)
        net.eval()
        with torch.no_grad():
            first = net(xte[:1]).argmax(1).item()
        print(f"checkpoint {a.check_checkpoint}: loaded with strict=True; "
              f"test_acc={accuracy(net, xte, yte):.2f}% correct={correct}/{xte.shape[0]} "
              f"first_class={first}", flush=True)
        return 0

    if a.infer_only:
        # The MNIST peer's inference protocol (kiln-bench's BenchInference follows it too).
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "shared", "peers"))
        from torch_peer import bench_inference
        xte, _ = raw_test_split("resnet", a.data)
        xte = normalise_as_kiln(xte, (1 / 255, torch.tensor([0.219] * 3), torch.tensor([0.3318] * 3)))
        net = ResNet8()
        if a.channels_last:
            net = net.to(memory_format=torch.channels_last)
            xte = xte.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            inf = bench_inference(net, xte)
        print(f"# torch {torch.__version__} threads={torch.get_num_threads()} infer-only "
              f"channels_last={a.channels_last} precision={a.precision}", flush=True)
        print(f"inference: b1 {inf['b1_img_per_s']:.0f} img/s, b1 median {inf['b1_median_us']:.1f} us"
              f" (p90 {inf['b1_p90_us']:.1f} us), b256 {inf['b256_img_per_s_best']:.0f} img/s"
              f" (best of 5; median {inf['b256_img_per_s_median']:.0f})", flush=True)
        print("SUMMARY " + json.dumps({"inference": inf}), flush=True)
        return 0

    xtr, ytr, xte, yte = (load_cifar if a.workload == "resnet" else load_table)(a.data)
    net = ResNet8() if a.workload == "resnet" else table_mlp(xtr.shape[1])
    if a.channels_last and a.workload == "resnet":
        net = net.to(memory_format=torch.channels_last)
        xtr = xtr.contiguous(memory_format=torch.channels_last)
        xte = xte.contiguous(memory_format=torch.channels_last)

    n = xtr.shape[0]
    if a.workload == "resnet":
        bs = 128
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                              weight_decay=5e-4)
        steps = (n + bs - 1) // bs
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=a.epochs * steps)
        lossf = nn.CrossEntropyLoss(label_smoothing=0.1)
    else:
        bs = 256
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        sched = None
        lossf = nn.CrossEntropyLoss()
    print(f"# torch {torch.__version__} threads={torch.get_num_threads()} workload={a.workload} "
          f"train={n} test={xte.shape[0]} batch={bs} epochs={a.epochs} augment={a.augment} "
          f"channels_last={a.channels_last} precision={a.precision} "
          f"params={sum(p.numel() for p in net.parameters())}", flush=True)
    g = torch.Generator().manual_seed(a.seed)
    epochs = []
    for ep in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(n, generator=g)
        loss_sum = 0.0
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            xb, yb = xtr[idx], ytr[idx]
            if a.channels_last and a.workload == "resnet":
                xb = xb.contiguous(memory_format=torch.channels_last)
            if a.augment:
                xb = augment(xb, g)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = lossf(net(xb), yb)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            loss_sum += loss.item() * idx.shape[0]
        dt = time.perf_counter() - t0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            acc = accuracy(net, xte, yte)
        epochs.append({"epoch": ep, "train_s": dt, "samples_per_s": n / dt,
                       "train_loss": loss_sum / n, "test_acc": acc})
        print(f"epoch {ep}: train_s={dt:.3f} samples/s={n / dt:.0f} loss={loss_sum / n:.4f} "
              f"test_acc={acc:.2f}%", flush=True)
    summary = {"workload": a.workload, "threads": a.threads, "batch": bs, "epochs": epochs,
               "precision": a.precision,
               "augment": a.augment, "torch": torch.__version__}
    print("SUMMARY " + json.dumps(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
