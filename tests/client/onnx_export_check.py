#!/usr/bin/python3
"""Checks the ONNX files kiln exports outside kiln: onnx.checker, then the graph evaluated here.

OnnxExportInterop (tests/client/onnx_export_test.cc) writes, per model (mlp, cnn, graph: every
layer kind in a residual DAG, table), DIR/NAME.onnx and DIR/NAME.eval.safetensors (the raw test
inputs with kiln's logits, served probabilities and classes), and DIR/gpt.onnx with
DIR/gpt.eval.safetensors (a tied 2-layer GPT: int64 token windows of the block's length and
shorter, with kiln's logits [N, T, vocab]):

  dir=$(mktemp -d)
  KILN_ONNX_EXPORT_DIR="$dir" onnx_export_tests --gtest_filter='OnnxExportInterop.*'
  tests/client/onnx_export_check.py "$dir"

Each model must pass onnx.checker.check_model(full_check=True) (Debian's onnx 1.12, which also
runs strict shape inference), use opset 13, take the raw inputs kiln takes, and give kiln's
outputs within 1e-4 when its graph is run by the small numpy evaluator below, which knows only the
ONNX operators' specification, not kiln. Exits 77 (skipped) without numpy or onnx.
"""
import math
import os
import sys

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
except ImportError as e:
    print(f"SKIP: {e} (Debian: python3-numpy, python3-onnx)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
from safetensors_torch_check import read  # noqa: E402  (the independent safetensors reader)

MODELS = ("mlp", "cnn", "graph", "table")
TOLERANCE = 1e-4
ONNX_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.UINT8: np.uint8,
              onnx.TensorProto.INT64: np.int64}


def attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def windows(x, kernel, strides, pads, pad_value):
    """(N, C, OH, OW, kh, kw) views of x (N, C, H, W) padded by pads (top, left, bottom, right)."""
    (top, left, bottom, right) = pads
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    view = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1]]


def conv(x, w, b, a):
    k = a.get("kernel_shape", list(w.shape[2:]))
    assert a.get("group", 1) == 1 and a.get("dilations", [1, 1]) == [1, 1], a
    v = windows(x, k, a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0]), 0.0)
    y = np.einsum("nchwij,ocij->nohw", v, w)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def pool(x, a, reduce):
    assert a.get("ceil_mode", 0) == 0, a
    pads = a.get("pads", [0, 0, 0, 0])
    if reduce == "max":
        return windows(x, a["kernel_shape"], a["strides"], pads, -np.inf).max(axis=(4, 5))
    assert a.get("count_include_pad", 0) == 1 or pads == [0, 0, 0, 0], a
    return windows(x, a["kernel_shape"], a["strides"], pads, 0.0).mean(axis=(4, 5))


def batchnorm(x, scale, bias, mean, var, a):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + a.get("epsilon", 1e-5))
    return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def gemm(x, w, b, a):
    assert a.get("transA", 0) == 0, a
    y = a.get("alpha", 1.0) * (x @ (w.T if a.get("transB", 0) else w))
    return y if b is None else y + a.get("beta", 1.0) * b


def onnx_slice(x, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[int(axis)] = slice(int(start), int(end), int(step))  # numpy clamps as ONNX does
    return x[tuple(index)]


def reshape(x, shape):
    # A 0 copies the input's dimension (opset 13 has no allowzero); -1 is inferred.
    dims = [x.shape[i] if d == 0 else int(d) for i, d in enumerate(shape)]
    return x.reshape(dims)


def split(x, sizes, a):
    axis = a.get("axis", 0)
    return np.split(x, np.cumsum(sizes)[:-1].astype(int), axis=axis)


ERF = np.vectorize(math.erf)

# The operators kiln's exporter may emit, as the ONNX specification (opset 13) defines them.
OPS = {
    "Cast": lambda i, a: i[0].astype(ONNX_TYPES[a["to"]]),
    "Mul": lambda i, a: i[0] * i[1],
    "Sub": lambda i, a: i[0] - i[1],
    "Div": lambda i, a: i[0] / i[1],
    "Add": lambda i, a: i[0] + i[1],
    "Gemm": lambda i, a: gemm(i[0], i[1], i[2] if len(i) > 2 else None, a),
    "Conv": lambda i, a: conv(i[0], i[1], i[2] if len(i) > 2 else None, a),
    "MaxPool": lambda i, a: pool(i[0], a, "max"),
    "AveragePool": lambda i, a: pool(i[0], a, "mean"),
    "GlobalAveragePool": lambda i, a: i[0].mean(axis=(2, 3), keepdims=True),
    "BatchNormalization": lambda i, a: batchnorm(*i, a),
    "Relu": lambda i, a: np.maximum(i[0], 0),
    "LeakyRelu": lambda i, a: np.where(i[0] >= 0, i[0], a.get("alpha", 0.01) * i[0]),
    "Tanh": lambda i, a: np.tanh(i[0]),
    "Sigmoid": lambda i, a: 1 / (1 + np.exp(-i[0])),
    "Erf": lambda i, a: ERF(i[0]),
    "Concat": lambda i, a: np.concatenate(i, axis=a["axis"]),
    "Flatten": lambda i, a: i[0].reshape(int(np.prod(i[0].shape[:a.get("axis", 1)])), -1),
    "Softmax": lambda i, a: softmax(i[0], a.get("axis", -1)),
    "Identity": lambda i, a: i[0],
    # Sequence models (GPT)
    "Gather": lambda i, a: np.take(i[0], i[1], axis=a.get("axis", 0)),
    "Shape": lambda i, a: np.array(i[0].shape, dtype=np.int64),
    "Slice": lambda i, a: onnx_slice(*i),
    "MatMul": lambda i, a: np.matmul(i[0], i[1]),
    "Transpose": lambda i, a: np.transpose(i[0], a.get("perm")),
    "Reshape": lambda i, a: reshape(i[0], i[1]),
    "Split": lambda i, a: split(i[0], i[1], a),
    "ReduceMean": lambda i, a: i[0].mean(axis=tuple(a["axes"]),
                                         keepdims=bool(a.get("keepdims", 1))),
    "Sqrt": lambda i, a: np.sqrt(i[0]),
}


def evaluate(model, feeds):
    """Runs the graph's nodes in order (ONNX requires topological order) over float64 values."""
    values = {}
    for t in model.graph.initializer:
        array = numpy_helper.to_array(t)
        values[t.name] = array.astype(np.float64) if array.dtype == np.float32 else array
    values.update(feeds)
    for node in model.graph.node:
        if node.op_type not in OPS:
            raise AssertionError(f"node {node.name}: operator {node.op_type} is not evaluated here")
        inputs = [values[name] for name in node.input if name]
        outs = OPS[node.op_type](inputs, attributes(node))
        outs = outs if isinstance(outs, list) else [outs]
        assert len(outs) == len(node.output), f"node {node.name}: {len(outs)} outputs"
        for name, out in zip(node.output, outs):
            values[name] = out.astype(np.float64) if out.dtype == np.float32 else out
    return {o.name: values[o.name] for o in model.graph.output}


def compare(name, got, want):
    assert got.shape == want.shape, f"{name}: shape {got.shape}, kiln's {want.shape}"
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    worst = float(err.max())
    assert worst <= TOLERANCE, f"{name}: off kiln's by {worst:.3g} (relative) at " \
        f"{np.unravel_index(err.argmax(), err.shape)}: {got.flat[err.argmax()]} vs " \
        f"{want.flat[err.argmax()]}"
    return worst


def check(directory, name):
    model = onnx.load(os.path.join(directory, name + ".onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)], model.opset_import
    tensors, metadata = read(os.path.join(directory, name + ".eval.safetensors"))
    raw = tensors["input"][1]
    (graph_input,) = model.graph.input
    assert graph_input.name == "input", graph_input.name
    want_type = onnx.TensorProto.FLOAT if name == "table" else onnx.TensorProto.UINT8
    assert graph_input.type.tensor_type.elem_type == want_type, graph_input
    assert ONNX_TYPES[want_type] == raw.dtype.type, raw.dtype
    assert [o.name for o in model.graph.output] == ["logits", "probabilities"]
    out = evaluate(model, {"input": raw})
    worst = max(compare(name + " logits", out["logits"], tensors["logits"][1]),
                compare(name + " probabilities", out["probabilities"], tensors["probabilities"][1]))
    classes = out["probabilities"].argmax(axis=1)
    assert np.array_equal(classes, tensors["classes"][1]), f"{name}: classes differ from kiln's"
    accuracy = float((classes == tensors["labels"][1]).mean())
    kiln_accuracy = float(metadata["accuracy"])
    # The same classes give the same accuracy; kiln's is written with 6 significant digits.
    assert abs(accuracy - kiln_accuracy) < 1e-5, \
        f"{name}: accuracy {accuracy}, kiln's {kiln_accuracy}"
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"OK: {name}.onnx: checker passes; {len(raw)} samples within {worst:.2g} of kiln's "
          f"outputs, accuracy {accuracy:.4f} as kiln's; ops {', '.join(ops)}")


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def check_gpt(directory):
    """gpt.onnx: int64 ids [N, T] in, logits [N, T, vocab] out, for the full block and a shorter
    window, against kiln's logits."""
    model = onnx.load(os.path.join(directory, "gpt.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)], model.opset_import
    (graph_input,) = model.graph.input
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.INT64, graph_input
    assert dims(graph_input) == ["N", "T"], dims(graph_input)
    assert [o.name for o in model.graph.output] == ["logits", "probabilities"]
    assert dims(model.graph.output[0]) == ["N", "T", 11], dims(model.graph.output[0])
    tensors, _ = read(os.path.join(directory, "gpt.eval.safetensors"))
    worst = 0.0
    for suffix in ("", "_short"):
        ids, want = tensors["input" + suffix][1], tensors["logits" + suffix][1]
        out = evaluate(model, {"input": ids})
        worst = max(worst, compare("gpt logits" + suffix, out["logits"], want),
                    compare("gpt probabilities" + suffix, out["probabilities"],
                            softmax(want.astype(np.float64), -1)))
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"OK: gpt.onnx: checker passes; logits for T = 16 and 6 within {worst:.2g} of kiln's; "
          f"ops {', '.join(ops)}")


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    for name in MODELS:
        check(sys.argv[1], name)
    check_gpt(sys.argv[1])


if __name__ == "__main__":
    main()
