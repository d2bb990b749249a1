#!/usr/bin/python3
"""Checks a kiln checkpoint with batch normalisation against PyTorch's state_dict and eval forward.

BatchNormTorchInterop (tests/engine/batchnorm_test.cc) writes DIR/model.safetensors, a trained

  nn.Sequential(Conv2d(3, 4, 3, padding=1, bias=False), BatchNorm2d(4, momentum=0.2), ReLU(),
                Flatten(), Linear(100, 6), BatchNorm1d(6, eps=1e-3))

with SGD momentum state, and DIR/eval.safetensors, an input batch and kiln's evaluation outputs:

  dir=$(mktemp -d)
  KILN_BATCHNORM_TORCH_DIR="$dir" engine_tests --gtest_filter='BatchNormTorchInterop.*'
  tests/engine/batchnorm_torch_check.py "$dir"

(ctest runs both steps as engine_batchnorm_torch_interop, skipped where there is no torch.)
This checks that the model's tensors are exactly that module's state_dict (names, dtypes, shapes;
num_batches_tracked a 0-dim int64), and that an evaluation forward pass written here in plain
Python (running statistics) gives kiln's outputs. Where PyTorch is installed it also loads the
model's tensors into the module with strict=True and compares its eval() outputs.
"""

import json
import math
import struct
import sys

FORMATS = {"F32": ("<f", 4), "I64": ("<q", 8)}

# The torch module's state_dict: name -> (dtype, shape).
STATE_DICT = {
    "0.weight": ("F32", [4, 3, 3, 3]),
    "1.weight": ("F32", [4]),
    "1.bias": ("F32", [4]),
    "1.running_mean": ("F32", [4]),
    "1.running_var": ("F32", [4]),
    "1.num_batches_tracked": ("I64", []),
    "4.weight": ("F32", [6, 100]),
    "4.bias": ("F32", [6]),
    "5.weight": ("F32", [6]),
    "5.bias": ("F32", [6]),
    "5.running_mean": ("F32", [6]),
    "5.running_var": ("F32", [6]),
    "5.num_batches_tracked": ("I64", []),
}
EPS = {"1": 1e-5, "5": 1e-3}


def read(path):
    """name -> (dtype, shape, flat list of values) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        fmt, size = FORMATS[info["dtype"]]
        begin, end = info["data_offsets"]
        count = (end - begin) // size
        values = list(struct.unpack("<" + fmt[1] * count, data[begin:end]))
        out[name] = (info["dtype"], info["shape"], values)
    return out


def eval_forward(t, x, batch):
    """The module's eval() forward in plain Python; x is flat (batch, 3, 5, 5)."""
    w = t["0.weight"][2]
    out = []
    for n in range(batch):
        # conv 3->4, 3x3, padding 1, no bias
        conv = [0.0] * 100
        for o in range(4):
            for i in range(5):
                for j in range(5):
                    s = 0.0
                    for c in range(3):
                        for a in range(3):
                            for b in range(3):
                                ii, jj = i + a - 1, j + b - 1
                                if 0 <= ii < 5 and 0 <= jj < 5:
                                    s += w[((o * 3 + c) * 3 + a) * 3 + b] * \
                                        x[((n * 3 + c) * 5 + ii) * 5 + jj]
                    conv[(o * 5 + i) * 5 + j] = s
        # batchnorm2d with running statistics, then relu
        for k in range(100):
            o = k // 25
            v = (conv[k] - t["1.running_mean"][2][o]) / math.sqrt(
                t["1.running_var"][2][o] + EPS["1"])
            conv[k] = max(0.0, v * t["1.weight"][2][o] + t["1.bias"][2][o])
        # linear 100->6, batchnorm1d
        for f in range(6):
            s = t["4.bias"][2][f]
            for k in range(100):
                s += t["4.weight"][2][f * 100 + k] * conv[k]
            v = (s - t["5.running_mean"][2][f]) / math.sqrt(t["5.running_var"][2][f] + EPS["5"])
            out.append(v * t["5.weight"][2][f] + t["5.bias"][2][f])
    return out


def compare(got, want, what):
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, want))
    print(f"{what}: worst relative difference {worst:.3g} over {len(want)} outputs")
    assert len(got) == len(want) and worst < 1e-4, f"{what} differs from kiln's outputs"


def main():
    directory = sys.argv[1]
    tensors = read(directory + "/model.safetensors")
    model = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    assert set(model) == set(STATE_DICT), \
        f"model tensors {sorted(model)} are not the state_dict {sorted(STATE_DICT)}"
    for name, (dtype, shape) in STATE_DICT.items():
        assert model[name][:2] == (dtype, shape), f"{name} is {model[name][:2]}, torch has " \
            f"{(dtype, shape)}"
    assert model["1.num_batches_tracked"][2] == [3], model["1.num_batches_tracked"]
    assert any(k.startswith("optimizer.") for k in tensors), "no optimizer state was written"
    io = read(directory + "/eval.safetensors")
    x, want = io["input"][2], io["output"][2]
    batch = io["input"][1][0]
    compare(eval_forward(model, x, batch), want, "plain Python eval forward")

    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: strict load_state_dict not checked")
        return
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4, momentum=0.2),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(100, 6),
        torch.nn.BatchNorm1d(6, eps=1e-3))
    state = {}
    for name, (dtype, shape, values) in model.items():
        torch_dtype = torch.int64 if dtype == "I64" else torch.float32
        state[name] = torch.tensor(values, dtype=torch_dtype).reshape(shape)
    net.load_state_dict(state, strict=True)
    net.eval()
    with torch.no_grad():
        y = net(torch.tensor(x, dtype=torch.float32).reshape(io["input"][1]))
    compare(y.flatten().tolist(), want, "torch eval forward (strict=True load)")


if __name__ == "__main__":
    main()
