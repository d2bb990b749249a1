#!/usr/bin/python3
"""Checks kiln's safetensors files against an independent reader and writer (struct, json, numpy).

Hugging Face's `safetensors` package is not installable here, so this reimplements its format
from the spec and exchanges one fixed set of tensors with SafetensorsInteropTest:

  dir=$(mktemp -d)
  tests/engine/safetensors_torch_check.py write "$dir/from_python.safetensors"
  KILN_SAFETENSORS_INTEROP_DIR="$dir" engine_tests \
      --gtest_filter='SafetensorsInteropTest.*'   # reads from_python, writes from_cpp
  tests/engine/safetensors_torch_check.py check "$dir/from_cpp.safetensors"

ctest runs these three steps as engine_safetensors_interop (tests/support/writer_then_check.py).
Other checks import read() from here as their safetensors reader.
"""

import json
import struct
import sys

import numpy as np

DTYPES = {"F32": "<f4", "I32": "<i4", "U8": "u1", "I64": "<i8", "U64": "<u8"}

# Must match InteropTensors() in safetensors_test.cc.
EXPECTED = {
    "layer.0.weight": np.array([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], dtype="<f4"),
    "scalar": np.array(3.25, dtype="<f4"),
    "empty": np.zeros([0], dtype="<f4"),
    "step": np.array([42, -1], dtype="<i8"),
    "rng": np.array([2**64 - 1, 12345678901234567890], dtype="<u8"),
    "mask": np.array([0, 1, 127, 255], dtype="u1"),
    "labels": np.array([-2, 0, 2147483647], dtype="<i4"),
}
EXPECTED_DTYPES = {
    "layer.0.weight": "F32", "scalar": "F32", "empty": "F32", "step": "I64", "rng": "U64",
    "mask": "U8", "labels": "I32",
}
EXPECTED_METADATA = {"format": "pt", "kiln": "interop"}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    header_bytes = blob[8:8 + n]
    assert header_bytes.startswith(b"{"), "header does not start with '{'"
    assert header_bytes.rstrip(b" ").endswith(b"}"), "header padding is not spaces"
    header = json.loads(header_bytes.decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    end = 0
    for begin, stop, name in spans:
        assert begin == end, f"{name}: data not contiguous at {begin} (expected {end})"
        end = stop
    assert end == len(data), f"tensors cover {end} bytes of a {len(data)}-byte data section"
    tensors = {}
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        dtype = np.dtype(DTYPES[info["dtype"]])
        array = np.frombuffer(data[begin:stop], dtype=dtype).reshape(info["shape"])
        tensors[name] = (info["dtype"], array)
    return tensors, metadata


def check(path):
    tensors, metadata = read(path)
    assert metadata == EXPECTED_METADATA, metadata
    assert set(tensors) == set(EXPECTED), sorted(tensors)
    for name, want in EXPECTED.items():
        dtype, got = tensors[name]
        assert dtype == EXPECTED_DTYPES[name], (name, dtype)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert np.array_equal(got, want), (name, got, want)
    print(f"OK: {path}: {len(tensors)} tensors and metadata match")


def write(path):
    # Deliberately unlike kiln's writer: reverse name order, metadata last, so the C++ reader is
    # tested on an order it did not produce.
    header, chunks, offset = {}, [], 0
    for name in sorted(EXPECTED, reverse=True):
        raw = EXPECTED[name].tobytes()
        header[name] = {"dtype": EXPECTED_DTYPES[name], "shape": list(EXPECTED[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = EXPECTED_METADATA
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    read(path)  # Self-check.
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        sys.exit(f"usage: {sys.argv[0]} check|write FILE")
    {"check": check, "write": write}[sys.argv[1]](sys.argv[2])
