#!/usr/bin/python3
"""The MNIST peer (../shared/peers/torch_peer.py) under torch.autocast(bfloat16), for kiln's bf16.

  bench/torch_peer_autocast.py [torch_peer.py's arguments]

The shared peer trains in float32 and has no precision option (the shared folder is the
project's, read-only here), so this runs its own main() with its model's forward under
torch.autocast(device, dtype=torch.bfloat16), as PyTorch's AMP recipe puts it: matmuls and
convolutions in bfloat16 by autocast's own lists, the logits handed to the loss in float32
(autocast runs cross-entropy in float32 too), backward and the optimizer outside autocast.
(Wrapping the whole training step in autocast, backward and Adam included, made torch 1.13's
CNN stop learning: 9.6% test accuracy.) bench/compare-torch --precision bf16 calls it.
"""
import importlib.util
import os
import sys

import torch

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers",
                    "torch_peer.py")


class AutocastForward(torch.nn.Module):
    """`net` with its forward under torch.autocast(bfloat16), its output in float32."""

    def __init__(self, net, device_type):
        super().__init__()
        self.net = net
        self.device_type = device_type

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.net(x).float()


def main():
    spec = importlib.util.spec_from_file_location("torch_peer", PEER)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    device = "cpu"
    if "--device" in sys.argv[1:-1]:
        device = sys.argv[sys.argv.index("--device") + 1]
    build = peer.build
    peer.build = lambda model: AutocastForward(build(model), device.split(":")[0])
    sys.argv[0] = PEER
    peer.main()


if __name__ == "__main__":
    main()
