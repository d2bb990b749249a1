#!/usr/bin/python3
"""End to end through kilnd: issue 19's reference models, trained as a user would, load into the
matching PyTorch modules with strict=True and score what kiln scored.

  tests/e2e/torch_loads_kiln_checkpoints.py KILND KILN

Makes a small CIFAR-10-format image set and a CSV table here, starts KILND on temporary folders,
uploads both with `kiln upload` (--format cifar10, --format csv), trains
examples/resnet-cifar.json and examples/table-mlp.json for three epochs with `kiln submit --watch
--output json`, exports each final checkpoint with `kiln export`, then runs
bench/torch_cifar_peer.py --check-checkpoint: ResNet-8 and the table MLP as torch.nn modules,
`load_state_dict(strict=True)`, the test split normalised only from the checkpoint's own record.
The test accuracy must be kiln's to within one sample (the two libraries sum in different orders,
which can tip a sample whose top two logits are within rounding). Both models are also deployed
and `kiln predict` must give the class torch gives for the first test sample.

Exits 77 (skipped) where /usr/bin/python3 has no torch or numpy (Debian: python3-torch,
python3-numpy, which scripts/install-deps installs).
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from kilnd_child import start_kilnd  # noqa: E402
PEER = os.path.join(ROOT, "bench", "torch_cifar_peer.py")
SPECS = {"resnet": "examples/resnet-cifar.json", "table": "examples/table-mlp.json"}
TEST_SAMPLES = 400


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def make_cifar(d, rng):
    """Ten classes of 32x32x3 bytes: class k is a faint 6x6 square near one of ten places in
    channel k % 3, over noise as strong, so that a few epochs learn much but not all of it (a
    perfect score would hide a wrong normalisation)."""
    os.makedirs(d)

    def records(n):
        out = bytearray()
        for _ in range(n):
            k = rng.randrange(10)
            img = bytearray(rng.randrange(100) for _ in range(3072))
            y0 = 4 + 8 * (k // 4) + rng.randrange(-2, 3)
            x0 = 2 + 8 * (k % 4) + rng.randrange(-2, 3)
            for y in range(y0, y0 + 6):
                for x in range(x0, x0 + 6):
                    img[(k % 3) * 1024 + y * 32 + x] = 40 + rng.randrange(100)
            out += bytes([k]) + img
        return bytes(out)

    open(os.path.join(d, "data_batch_1.bin"), "wb").write(records(2048))
    open(os.path.join(d, "test_batch.bin"), "wb").write(records(TEST_SAMPLES))


def make_table(d, rng):
    """32 features in the hundreds (so standardisation matters), 10 classes around centres."""
    os.makedirs(d)
    centres = [[rng.gauss(0, 1) for _ in range(32)] for _ in range(10)]

    def rows(n):
        lines = [",".join(f"f{i}" for i in range(32)) + ",label"]
        for _ in range(n):
            k = rng.randrange(10)
            feats = [300 + 50 * (c + rng.gauss(0, 2.5)) for c in centres[k]]
            lines.append(",".join(f"{v:.4f}" for v in feats) + f",{k}")
        return "\n".join(lines) + "\n"

    open(os.path.join(d, "train.csv"), "w").write(rows(2048))
    open(os.path.join(d, "test.csv"), "w").write(rows(TEST_SAMPLES))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kilnd, kiln_bin = sys.argv[1], sys.argv[2]
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: /usr/bin/python3 cannot import {e.name} (apt-get install python3-torch "
              "python3-numpy)")
        return 77

    tmp = tempfile.mkdtemp(prefix="kiln-torch-e2e-")
    rng = random.Random(19)
    make_cifar(os.path.join(tmp, "cifar"), rng)
    make_table(os.path.join(tmp, "table"), rng)
    try:
        proc, addr = start_kilnd(kilnd, tmp)
    except RuntimeError as e:
        fail(str(e))
    env = dict(os.environ, KILN_SERVER=addr)

    def kiln(*args):
        out = subprocess.run([kiln_bin, *args], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"kiln {' '.join(args)} exited {out.returncode}:\n{out.stderr}")
        return out.stdout

    try:
        kiln("upload", "resnet", "--format", "cifar10", "--train",
             os.path.join(tmp, "cifar", "data_batch_1.bin"), "--test",
             os.path.join(tmp, "cifar", "test_batch.bin"))
        kiln("upload", "table", "--format", "csv", "--train",
             os.path.join(tmp, "table", "train.csv"), "--test",
             os.path.join(tmp, "table", "test.csv"))
        for workload, data, sample in (("resnet", "cifar", "test_batch.bin"),
                                       ("table", "table", "test.csv")):
            job, acc = None, None
            events = kiln("submit", os.path.join(ROOT, SPECS[workload]), "--dataset", workload,
                          "--epochs", "3", "--watch", "--output", "json")
            for line in events.splitlines():
                e = json.loads(line)
                job = job or e.get("id")
                if isinstance(e.get("epoch"), dict):
                    acc = e["epoch"]["test_accuracy"]
            if job is None or acc is None:
                fail(f"{workload}: no job id or no epoch event in kiln's stream:\n{events[:2000]}")
            ckpt = os.path.join(tmp, workload + ".safetensors")
            kiln("export", job, "-o", ckpt)
            peer = subprocess.run([sys.executable, PEER, workload, os.path.join(tmp, data),
                                   "--threads", "2", "--check-checkpoint", ckpt],
                                  capture_output=True, text=True)
            m = re.search(r"loaded with strict=True; test_acc=\S+ correct=(\d+)/(\d+) "
                          r"first_class=(\d+)",
                          peer.stdout)
            if peer.returncode != 0 or not m:
                fail(f"{workload}: torch did not load the checkpoint:\n{peer.stdout}"
                     f"{peer.stderr}")
            kiln_correct = round(acc * TEST_SAMPLES)
            torch_correct = int(m.group(1))
            print(f"{workload}: kiln {kiln_correct}/{TEST_SAMPLES}, torch (strict=True) "
                  f"{torch_correct}/{m.group(2)}", flush=True)
            if abs(kiln_correct - torch_correct) > 1:
                fail(f"{workload}: torch scores {torch_correct} but kiln {kiln_correct}")
            if kiln_correct < TEST_SAMPLES // 4:  # 2.5 times chance
                fail(f"{workload}: training learned too little ({kiln_correct}) to compare")
            # Served as a model, the first test sample gets a class from kiln's predict.
            kiln("deploy", job, "--name", workload)
            answer = json.loads(kiln("predict", workload, os.path.join(tmp, data, sample),
                                     "--index", "0", "--output", "json"))
            predicted = answer["predictions"][0]["class"]
            print(f"{workload}: first test sample: kiln predict says class {predicted}, torch "
                  f"{m.group(3)}", flush=True)
            if predicted != int(m.group(3)):
                fail(f"{workload}: the served model and torch disagree on the first sample")
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
