#!/usr/bin/python3
"""Loads kiln checkpoints into the matching torch.nn.Sequential with strict=True; scores them.

OnnxExportInterop (tests/client/onnx_export_test.cc) trains the reference MLP (784-512-256-10),
the reference CNN (conv 32, pool, conv 64, pool, fc 128, fc 10) and a table MLP
(Linear-BatchNorm1d-ReLU-Dropout-Linear), and writes DIR/NAME.safetensors with
DIR/NAME.eval.safetensors (the raw test split, its labels, kiln's logits and test accuracy):

  dir=$(mktemp -d)
  KILN_ONNX_EXPORT_DIR="$dir" onnx_export_tests --gtest_filter='OnnxExportInterop.*'
  tests/client/torch_sequential_check.py "$dir"

Each checkpoint's model tensors (all but optimizer.*) must load into its nn.Sequential with
strict=True, and the module, fed the raw test split normalised as README says from the
checkpoint's kiln.norm metadata alone, must give kiln's logits within 1e-4 and kiln's test
accuracy. Exits 77 (skipped) without torch or numpy (Debian: python3-torch, python3-numpy).
"""
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (Debian: python3-torch, python3-numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
from safetensors_torch_check import read  # noqa: E402  (the independent safetensors reader)

nn = torch.nn
MODULES = {
    "mlp": lambda: nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, 10)),
    "cnn": lambda: nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10)),
    "table": lambda: nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                   nn.Dropout(0.2), nn.Linear(32, 4)),
}


def normalise(raw, norm):
    """kiln.norm "scale,mean,std[;m0,m1,...;s0,s1,...[;features]]" applied to raw inputs:
    x = (raw * scale - mean[c]) / std[c], c the channel (first per-sample dimension) or feature."""
    sections = norm.split(";")
    scale, mean, std = (float(v) for v in sections[0].split(","))
    x = raw.astype(np.float64) * scale
    if len(sections) >= 3:
        shape = (1, -1) + (1,) * (raw.ndim - 2)
        mean = np.array([float(v) for v in sections[1].split(",")]).reshape(shape)
        std = np.array([float(v) for v in sections[2].split(",")]).reshape(shape)
    return ((x - mean) / std).astype(np.float32)


def check(directory, name):
    tensors, metadata = read(os.path.join(directory, name + ".safetensors"))
    state = {k: torch.from_numpy(v.copy()) for k, (_, v) in tensors.items()
             if not k.startswith("optimizer.")}
    net = MODULES[name]()
    net.load_state_dict(state, strict=True)
    net.eval()
    io, io_meta = read(os.path.join(directory, name + ".eval.safetensors"))
    x = normalise(io["input"][1], metadata["kiln.norm"])
    with torch.no_grad():
        logits = net(torch.from_numpy(x)).double().numpy()
    want = io["logits"][1]
    err = float((np.abs(logits - want) / np.maximum(1.0, np.abs(want))).max())
    assert err <= 1e-4, f"{name}: torch's logits are off kiln's by {err:.3g}"
    labels = io["labels"][1]
    correct = int((logits.argmax(axis=1) == labels).sum())
    kiln_correct = round(float(io_meta["accuracy"]) * len(labels))
    # The two libraries sum in different orders: a sample whose top two logits are within
    # rounding may tip, so one sample either way is kiln's accuracy.
    assert abs(correct - kiln_correct) <= 1, \
        f"{name}: torch gets {correct} of {len(labels)} right, kiln {kiln_correct}"
    print(f"OK: {name}: strict load into torch.nn.Sequential; logits within {err:.2g} of kiln's; "
          f"test accuracy {correct}/{len(labels)} (kiln {kiln_correct})")


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    for name in MODULES:
        check(sys.argv[1], name)


if __name__ == "__main__":
    main()
