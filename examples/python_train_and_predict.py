#!/usr/bin/python3
"""Train, plot, serve and predict with kilnd from Python, in cells as a notebook would run them.

  PYTHONPATH=build/python examples/python_train_and_predict.py [--server HOST:PORT]
      [--data data/mnist | --synthetic] [--epochs 1] [--plot loss.png]

--data: a folder of MNIST-style IDX files (gzip or not), e.g. data/mnist from scripts/fetch-mnist
or Debian's /usr/share/datasets/fashion-mnist; uploaded as dataset "python-example" unless kilnd
already has it. --synthetic: no files, 28x28 images where each class is a bright block in its own
place (what the tests run). The token comes from --token or $KILN_TOKEN, the CA of a TLS kilnd
from --tls-ca. Needs python3-grpcio, python3-numpy and python3-matplotlib (Debian).
"""
# %% Setup
import argparse
import gzip
import os

import matplotlib

matplotlib.use("Agg")  # a PNG file, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import kiln  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--server", default=os.environ.get("KILN_SERVER", "127.0.0.1:7070"))
parser.add_argument("--token", default=None, help="bearer token (default: $KILN_TOKEN)")
parser.add_argument("--tls-ca", default=None, help="CA of kilnd's certificate (turns TLS on)")
parser.add_argument("--data", default="data/mnist", help="folder of the four IDX files")
parser.add_argument("--synthetic", action="store_true", help="make a small dataset instead")
parser.add_argument("--dataset", default="python-example", help="dataset name on kilnd")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--plot", default="loss.png", help="PNG file of the loss curve")
args = parser.parse_args()

client = kiln.Client(args.server, token=args.token, tls_ca=args.tls_ca)


# %% Data: numpy arrays, uploaded to kilnd (IDX files as they are, synthetic ones as .npy)
def read_idx(path):
    """An IDX file (gzip or not) as a numpy array of its shape."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    dims = raw[3]
    shape = np.frombuffer(raw, dtype=">u4", count=dims, offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def idx_file(folder, name):
    for candidate in (name, name + ".gz"):
        if os.path.exists(os.path.join(folder, candidate)):
            return os.path.join(folder, candidate)
    raise SystemExit(f"{folder} has no {name}: run scripts/fetch-mnist, or pass --synthetic")


def synthetic(n, rng):
    """n 28x28 images of 10 classes: class k is a bright 8x8 block at its own place, over noise."""
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 80, (n, 28, 28)).astype(np.uint8)
    for i, k in enumerate(labels):
        y, x = 2 + 8 * (k // 4), 2 + 6 * (k % 4)
        images[i, y:y + 8, x:x + 8] = rng.integers(160, 256, (8, 8))
    return images, labels


if args.synthetic:
    rng = np.random.default_rng(0)
    train_x, train_y = synthetic(4000, rng)
    test_x, test_y = synthetic(500, rng)
    upload = (train_x, train_y, test_x, test_y)
else:
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
    upload = [idx_file(args.data, n) for n in names]
    test_x, test_y = read_idx(upload[2]), read_idx(upload[3])
if args.dataset not in [d.name for d in client.datasets()]:
    dataset = client.upload(args.dataset, *upload)
    print(f"uploaded {dataset.name}: {dataset.train_samples} training and "
          f"{dataset.test_samples} test samples of {dataset.sample_shape}")

# %% Train: the reference MLP (784-512-256-10, SGD with momentum), watching every step
job = client.submit("mnist-mlp", dataset=args.dataset, epochs=args.epochs, lr=0.01)
print(f"submitted {job.id}")
steps, losses, epochs = [], [], []
for event in client.watch(job):
    if event.kind == "step":
        steps.append(event.global_step)
        losses.append(event.loss)
    elif event.kind == "epoch":
        epochs.append(event)
        print(f"epoch {event.epoch}: train loss {event.train_loss:.4f}, test accuracy "
              f"{event.test_accuracy:.2%}, {event.samples_per_sec:,.0f} samples/s")
    elif event.kind == "state":
        print(f"{job.id}: {event.state} {event.reason}".rstrip())
job = client.get(job)
if job.state != "SUCCEEDED":
    raise SystemExit(f"{job.id} {job.state}: {job.reason}")

# %% Plot the loss curve
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(steps, losses, linewidth=0.8, label="batch loss")
per_epoch = len(steps) // max(len(epochs), 1)
ax.plot([e.epoch * per_epoch for e in epochs], [e.train_loss for e in epochs], "o-",
        label="epoch mean")
ax.set(xlabel="step", ylabel="cross-entropy loss", yscale="log",
       title=f"{job.id}: test accuracy {job.best_test_accuracy:.2%}")
ax.legend()
fig.tight_layout()
fig.savefig(args.plot, dpi=100)
print(f"loss curve: {args.plot}")

# %% Serve the final checkpoint and classify test images
model = client.deploy(job, name="python-example", max_batch_size=64)
probabilities, classes = client.predict(model, test_x[:16])  # uint8 pixels, as trained
print("predicted:", " ".join(map(str, classes)))
print("labels:   ", " ".join(map(str, test_y[:16])))
print(f"confidence: {probabilities.max(axis=1).mean():.2%}; accuracy on 16: "
      f"{(classes == test_y[:16]).mean():.0%}")
client.undeploy(model)
client.close()
