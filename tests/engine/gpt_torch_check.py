#!/usr/bin/python3
"""Loads a kiln GPT checkpoint into the PyTorch peer's GPT module and compares it with kiln.

GptTorchInterop (tests/engine/gpt_torch_interop_test.cc) writes DIR/model.safetensors, a briefly
trained character GPT (nanoGPT's layout, lm_head tied to wte), and DIR/windows.safetensors: token
windows x, y (I32 [B, T]) with kiln's eval logits (F32 [B, T, vocab]) and mean cross-entropy loss:

  dir=$(mktemp -d)
  KILN_GPT_TORCH_DIR="$dir" engine_tests --gtest_filter='GptTorchInterop.*'
  tests/engine/gpt_torch_check.py "$dir"

(ctest runs both steps as engine_gpt_torch_interop, skipped where there is no torch.) The module
is the GPT class of ../shared/peers/torch_gpt_peer.py beside the repository (KILN_TORCH_GPT_PEER
names another file); its config comes from the checkpoint's kiln.model. Checks: the renamed
weights load with strict=True; the module's parameter count (the tied table once) equals the
checkpoint's and kiln's; its loss on the windows equals kiln's within 1e-4 relative, and so do
its logits.

load_kiln_gpt(path) is the loader on its own, for other scripts:
  sys.path.insert(0, "tests/engine"); from gpt_torch_check import load_kiln_gpt
  model, cfg = load_kiln_gpt("model.safetensors")   # model(idx, targets) -> loss
"""
import importlib.util
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEER = os.environ.get("KILN_TORCH_GPT_PEER",
                      os.path.join(os.path.dirname(REPO), "shared", "peers", "torch_gpt_peer.py"))
TOLERANCE = 1e-4

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (Debian: python3-numpy, python3-torch)")
    sys.exit(77)

sys.path.insert(0, HERE)
from safetensors_torch_check import read  # noqa: E402  (the independent safetensors reader)

# kiln's state-dict names (nanoGPT's: h.N.attn.c_attn) -> the peer module's (blocks.N.c_attn).
# lm_head.weight is absent from a checkpoint whose lm_head is tied: the module's is wte.weight.
NAME_TABLE = [
    (r"wte\.weight", r"wte.weight"),
    (r"wpe\.weight", r"wpe.weight"),
    (r"h\.(\d+)\.ln_1\.(weight|bias)", r"blocks.\1.ln_1.\2"),
    (r"h\.(\d+)\.attn\.c_attn\.(weight|bias)", r"blocks.\1.c_attn.\2"),
    (r"h\.(\d+)\.attn\.c_proj\.(weight|bias)", r"blocks.\1.c_proj.\2"),
    (r"h\.(\d+)\.ln_2\.(weight|bias)", r"blocks.\1.ln_2.\2"),
    (r"h\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.c_fc.\2"),
    (r"h\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp_proj.\2"),
    (r"ln_f\.(weight|bias)", r"ln_f.\1"),
    (r"lm_head\.weight", r"lm_head.weight"),
]


def torch_name(kiln_name):
    for pattern, replacement in NAME_TABLE:
        if re.fullmatch(pattern, kiln_name):
            return re.sub(pattern, replacement, kiln_name)
    raise ValueError(f"{kiln_name}: no tensor of the peer's GPT module takes this kiln tensor")


def peer_config(model):
    """The peer's (vocab, cfg, tied) from kiln.model, after checking every node computes what the
    peer's module computes (nanoGPT's layout, as tests/engine/gpt_config.h builds it)."""
    layers = {layer.get("name", str(i)): layer for i, layer in enumerate(model["layers"])}

    def node(name, kind, **fields):
        layer = layers.get(name)
        if layer is None or layer["type"] != kind:
            raise ValueError(f"node {name}: the peer's GPT needs a {kind} here, kiln.model has "
                             f"{layer and layer['type']}")
        for key, want in fields.items():
            if layer.get(key, want) != want:
                raise ValueError(f"node {name}: {key} is {layer[key]}, the peer's module has "
                                 f"{want}")
        return layer

    wte = node("wte", "embedding")
    vocab, d = wte["num_embeddings"], wte["embedding_dim"]
    block_size = node("wpe", "position_embedding", embedding_dim=d)["block_size"]
    attention = [l for l in model["layers"] if l["type"] == "causal_self_attention"]
    n_layer, n_head = len(attention), attention[0]["n_head"] if attention else 0
    for n in range(n_layer):
        h = f"h.{n}"
        for ln in ("ln_1", "ln_2"):
            node(f"{h}.{ln}", "layernorm", normalized_shape=d, eps=1e-5, affine=True, bias=True)
        node(f"{h}.attn", "causal_self_attention", n_head=n_head, n_embd=d, bias=True)
        node(f"{h}.mlp.c_fc", "linear", in_features=d, out_features=4 * d, bias=True)
        node(f"{h}.mlp.gelu", "gelu")
        node(f"{h}.mlp.c_proj", "linear", in_features=4 * d, out_features=d, bias=True)
    node("ln_f", "layernorm", normalized_shape=d, eps=1e-5, affine=True, bias=True)
    head = node("lm_head", "linear", in_features=d, out_features=vocab, bias=False)
    cfg = dict(n_layer=n_layer, n_head=n_head, n_embd=d, block_size=block_size)
    return vocab, cfg, head.get("tie_weight", "") == "wte"


def import_peer():
    spec = importlib.util.spec_from_file_location("torch_gpt_peer", PEER)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def load_kiln_gpt(path):
    """The peer's GPT module holding the kiln checkpoint's weights (strict=True), and its cfg."""
    tensors, metadata = read(path)
    vocab, cfg, tied = peer_config(json.loads(metadata["kiln.model"]))
    weights = {k: v for k, (_, v) in tensors.items() if not k.startswith("optimizer.")}
    state = {torch_name(k): torch.from_numpy(v.copy()) for k, v in weights.items()}
    if tied:
        assert "lm_head.weight" not in state, "a tied lm_head saved a weight of its own"
        state["lm_head.weight"] = state["wte.weight"]
    use_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    model = import_peer().GPT(vocab, cfg, use_sdpa)
    model.load_state_dict(state, strict=True)
    if tied:
        assert model.lm_head.weight is model.wte.weight, "the module's lm_head is not tied"
    cfg.update(vocab=vocab, tied=tied,
               checkpoint_parameters=sum(int(v.size) for v in weights.values()))
    return model.eval(), cfg


def logits_of(model, idx):
    """The module's forward up to the logits, from its own submodules (its forward returns the loss
    only)."""
    x = model.wte(idx) + model.wpe(torch.arange(idx.size(1)))
    for block in model.blocks:
        x = block(x)
    return model.lm_head(model.ln_f(x))


def compare(what, got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, kiln's {want.shape}"
    worst = float((np.abs(got - want) / np.maximum(1.0, np.abs(want))).max())
    print(f"{what}: worst relative difference {worst:.3g} over {want.size} values")
    assert worst <= TOLERANCE, f"{what} differs from kiln's by {worst:.3g}"


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    if not os.path.exists(PEER):
        print(f"SKIP: no PyTorch peer at {PEER} (KILN_TORCH_GPT_PEER names another)")
        sys.exit(77)
    torch.set_num_threads(2)
    directory = sys.argv[1]
    model, cfg = load_kiln_gpt(os.path.join(directory, "model.safetensors"))
    print(f"strict load into the peer's GPT: {cfg}")
    # parameters() lists the tied table once, as the checkpoint holds it.
    count = sum(p.numel() for p in model.parameters())
    assert count == cfg["checkpoint_parameters"], \
        f"module has {count} parameters, the checkpoint {cfg['checkpoint_parameters']}"
    _, metadata = read(os.path.join(directory, "model.safetensors"))
    vocabulary = json.loads(metadata["kiln.vocabulary"])
    assert len(vocabulary) == cfg["vocab"], f"{len(vocabulary)} characters, vocab {cfg['vocab']}"
    tensors, windows_meta = read(os.path.join(directory, "windows.safetensors"))
    assert count == int(windows_meta["parameters"]), \
        f"module has {count} parameters, kiln's model {windows_meta['parameters']}"
    x = torch.from_numpy(tensors["x"][1].astype(np.int64))
    y = torch.from_numpy(tensors["y"][1].astype(np.int64))
    with torch.no_grad():
        loss = model(x, y).item()
        logits = logits_of(model, x)
    compare("loss (the peer's forward)", [loss], tensors["loss"][1])
    compare("logits", logits.numpy(), tensors["logits"][1])
    kiln_loss = float(tensors["loss"][1][0])
    print(f"OK: {count} parameters; torch loss {loss:.6f}, kiln's {kiln_loss:.6f}")


if __name__ == "__main__":
    main()
