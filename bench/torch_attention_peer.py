#!/usr/bin/python3
# The peer of kiln-bench-attention: the same causal attention core in PyTorch, forward and
# backward, as nanoGPT writes it (scaled_dot_product_attention where torch has it, else the
# masked_fill/softmax path). Usage: torch_attention_peer.py THREADS.
import sys, time, statistics, torch
import torch.nn.functional as F
threads = int(sys.argv[1])
torch.set_num_threads(threads)
for (B, T, H, hd) in [(12, 64, 4, 32), (12, 256, 6, 64)]:
    C = H * hd
    qkv = torch.randn(B, T, 3 * C, requires_grad=True)
    dy = torch.randn(B, T, C)
    def step():
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, H, hd).transpose(1, 2)
        v = v.view(B, T, H, hd).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: nanoGPT's manual path
            att = (q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5)
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y.backward(dy)
        qkv.grad = None
    for _ in range(5): step()
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        for _ in range(5): step()
        times.append((time.perf_counter() - t0) / 5 * 1e3)
    print(f"torch {torch.__version__} threads {threads} B={B} T={T} H={H} hd={hd}: fwd+bwd median {statistics.median(times):.3f} ms (min {min(times):.3f})", "sdpa" if hasattr(F, "scaled_dot_product_attention") else "manual")
