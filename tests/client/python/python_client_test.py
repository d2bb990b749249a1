#!/usr/bin/python3
"""The Python client (client/python/kiln) end to end against a real kilnd.

  tests/client/python/python_client_test.py KILND PYTHONPATH

Starts KILND on temporary folders with a bearer-token file, makes a small learnable IDX dataset
(8x8 images: class k lights quadrant k), then through kiln.Client: refuses a wrong and a missing
token (UNAUTHENTICATED), uploads the dataset (and NPY arrays, a CSV table, a text corpus and
token shards), submits a spec dict
with plain enum names, watches it to SUCCEEDED (step, epoch and state events), lists jobs and
checkpoints, exports (bytes and sha256 checked against the record), resumes for one more epoch,
deploys, predicts from uint8 and float32 arrays and checks the classes, and checks error paths
(unknown job NOT_FOUND, a bad spec INVALID_ARGUMENT, a finished job's cancel FAILED_PRECONDITION,
a dead port UNAVAILABLE), and runs examples/python_train_and_predict.py --synthetic (a PNG of the
loss curve, predictions). Then a second kilnd with TLS: the client connects with tls_ca.

Exits 77 (skipped) where /usr/bin/python3 has no grpc or numpy (Debian: python3-grpcio,
python3-numpy, which scripts/install-deps installs).
"""
import hashlib
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import kilnd_child  # noqa: E402

TOKEN = "9b1d6e0c4a7f2385d6e1c0b9a8f7e6d5"
SIDE, CLASSES = 8, 4


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def make_images(n, rng):
    """n SIDExSIDE uint8 images and labels: class k has quadrant k bright over dim noise."""
    images, labels = bytearray(), bytearray()
    half = SIDE // 2
    for _ in range(n):
        k = rng.randrange(CLASSES)
        img = bytearray(rng.randrange(60) for _ in range(SIDE * SIDE))
        y0, x0 = half * (k // 2), half * (k % 2)
        for y in range(y0, y0 + half):
            for x in range(x0, x0 + half):
                img[y * SIDE + x] = 150 + rng.randrange(100)
        images += img
        labels.append(k)
    return bytes(images), bytes(labels)


def write_idx(d, prefix, images, labels, n):
    with open(os.path.join(d, prefix + "-images"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, SIDE, SIDE) + images)
    with open(os.path.join(d, prefix + "-labels"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + labels)


def start_kilnd(kilnd, tmp, name, *flags):
    try:
        return kilnd_child.start_kilnd(kilnd, os.path.join(tmp, name), *flags)
    except RuntimeError as e:
        fail(str(e))


def expect_error(code, fn, *args, **kwargs):
    import kiln
    try:
        fn(*args, **kwargs)
    except kiln.KilnError as e:
        check(e.code == code, f"{fn.__name__}: expected {code}, got {e.code}: {e.message}")
        # Only kilnd's words: no grpc exception chained for a traceback to show.
        check(e.__cause__ is None and (e.__context__ is None or e.__suppress_context__),
              f"{fn.__name__}: gRPC's error is chained to the KilnError")
        return e
    fail(f"{fn.__name__}: expected KilnError {code}, got no error")


SPEC = {
    "model": {"input_shape": [SIDE * SIDE], "layers": [
        {"linear": {"in_features": SIDE * SIDE, "out_features": 32}},
        {"relu": {}},
        {"linear": {"in_features": 32, "out_features": CLASSES}},
    ]},
    "optimizer": {"kind": "adam", "lr": 0.01},  # a plain enum name, as the client allows
    "checkpoint_policy": {"every_n_epochs": 1, "keep_best": True},
    "seed": 7,
}


def exercise(kiln, np, addr, tmp):
    expect_error("UNAUTHENTICATED", kiln.Client(addr, token="wrong").jobs)
    expect_error("UNAUTHENTICATED", kiln.Client(addr).jobs)
    c = kiln.Client(addr, token=TOKEN)
    me = c.whoami()
    check(me == {"user": "pat", "team": "vision", "role": "member", "auth": True}, f"whoami: {me}")

    d = os.path.join(tmp, "blocks")
    ds = c.upload("blocks", os.path.join(d, "train-images"), os.path.join(d, "train-labels"),
                  os.path.join(d, "test-images"), os.path.join(d, "test-labels"))
    check(ds.name == "blocks" and ds.format == "IDX" and ds.train_samples == 512 and
          ds.test_samples == 128 and ds.sample_shape == (SIDE, SIDE), f"upload: {ds}")
    rng = np.random.default_rng(0)
    arrays = c.upload("arrays", rng.integers(0, 255, (20, 3, 4, 4), dtype=np.uint8),
                      np.arange(20) % 3)
    check(arrays.format == "NPY" and arrays.train_samples == 20 and
          arrays.sample_shape == (3, 4, 4) and arrays.num_classes == 3, f"upload arrays: {arrays}")
    csv = os.path.join(tmp, "rows.csv")
    with open(csv, "w") as f:
        f.write("a,b,label\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(10)))
    table = c.upload_csv("rows", csv, test_fraction=0.2)
    check(table.format == "CSV" and table.train_samples + table.test_samples == 10,
          f"upload_csv: {table}")
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("to be or not to be, é\n")  # 22 characters, 10 distinct
    text = c.upload_text("bard", corpus, val_fraction=0.5)
    check(text.format == "TEXT" and text.train_tokens == 11 and text.val_tokens == 11 and
          text.vocab_size == 10, f"upload_text: {text}")
    shard = os.path.join(tmp, "tokens.bin")
    tokens = np.arange(600, dtype="<u2") * 5
    with open(shard, "wb") as f:
        f.write(np.array([20240520, 1, 600] + [0] * 253, dtype="<i4").tobytes() + tokens.tobytes())
    shards = c.upload_tokens("shards", [shard, shard], val=shard)
    check(shards.format == "TOKENS" and shards.train_tokens == 1200 and shards.val_tokens == 600
          and shards.max_token == 2995, f"upload_tokens: {shards}")
    check({"blocks", "arrays", "rows"} <= {x.name for x in c.datasets()}, "datasets()")
    c.delete_dataset("rows")
    check("rows" not in {x.name for x in c.datasets()}, "delete_dataset: still listed")
    # A spec file as `kiln submit` takes it, overrides replacing its values.
    spec = kiln.specs.build_spec(os.path.join(ROOT, "examples", "table-mlp.json"), epochs=2,
                                 dataset="table", optimizer={"kind": "sgd", "lr": 0.1})
    check(spec.epochs == 2 and spec.dataset == "table" and len(spec.model.layers) == 7 and
          spec.optimizer.kind == kiln.stubs.spec_pb2.OptimizerSpec.KIND_SGD, f"spec: {spec}")
    # Plain enum names as the CLI takes them; an unknown one lists the accepted names as it does.
    for name, kind in (("cosine", "KIND_COSINE"), ("warmup_cosine", "KIND_WARMUP_COSINE")):
        # "cosine" also ends KIND_WARMUP_COSINE: its own plain name wins.
        got = kiln.specs.build_spec({"schedule": {"kind": name}}).schedule.kind
        check(got == kiln.stubs.spec_pb2.ScheduleSpec.Kind.Value(kind), f"{name}: {got}")
    plain = kiln.specs.build_spec({"schedule": {"kind": "One_Cycle", "anneal": "linear"}})
    check(plain.schedule.kind == kiln.stubs.spec_pb2.ScheduleSpec.KIND_ONE_CYCLE and
          plain.schedule.anneal == kiln.stubs.spec_pb2.ScheduleSpec.ANNEAL_LINEAR,
          f"plain enum names: {plain}")
    tf32 = kiln.specs.build_spec("mnist-mlp", precision="tf32")
    check(tf32.precision == kiln.stubs.spec_pb2.PRECISION_TF32, f"precision=: {tf32}")
    bf16 = kiln.specs.build_spec("mnist-mlp", precision="bf16")
    check(bf16.precision == kiln.stubs.spec_pb2.PRECISION_BF16, f"precision=bf16: {bf16}")
    fp16 = expect_error("INVALID_ARGUMENT", kiln.specs.build_spec, "mnist-mlp", precision="fp16")
    check('spec.precision: unknown value "fp16"; expected fp32, tf32 or bf16' in fp16.message,
          f"precision=fp16: {fp16.message}")
    unknown = expect_error("INVALID_ARGUMENT", kiln.specs.build_spec,
                           {"optimizer": {"kind": "rmsprop"}})
    check('spec.optimizer.kind: unknown value "rmsprop"; expected sgd, adam or adamw' in
          unknown.message,
          f"unknown enum name: {unknown.message}")

    expect_error("INVALID_ARGUMENT", c.submit, SPEC, dataset="blocks", batch_size=0)
    job = c.submit(SPEC, dataset="blocks", epochs=3, batch_size=32, name="blocks run",
                   labels={"team": "vision"}, priority="high")
    check(job.id.startswith("job-") and job.state in ("QUEUED", "RUNNING"), f"submit: {job}")
    check(job.owner == "pat/vision" and job.priority == "HIGH", f"owner, priority: {job}")
    check(job.name == "blocks run" and job.labels == {"team": "vision"}, f"name, labels: {job}")
    check([j.id for j in c.jobs(labels={"team": "vision"})] == [job.id] and
          not c.jobs(labels={"team": "audio"}) and c.jobs(labels={"team": None}),
          "jobs(labels=...)")
    expect_error("INVALID_ARGUMENT", c.submit, SPEC, dataset="blocks", labels={"team": "a b"})
    steps, epochs, states = [], [], []
    for event in c.watch(job):
        {"step": steps, "epoch": epochs, "state": states}.get(event.kind, []).append(event)
    check(states and states[-1].state == "SUCCEEDED", f"watch: last state {states[-1:]}")
    check([e.epoch for e in epochs] == [1, 2, 3], f"watch: epochs {[e.epoch for e in epochs]}")
    check(len(steps) == 3 * 16 and [s.global_step for s in steps] == list(range(1, 49)),
          f"watch: {len(steps)} step events")
    check(epochs[-1].test_accuracy > 0.9, f"learned too little: {epochs[-1]}")
    print(f"trained {job.id}: loss {steps[0].loss:.3f} -> {steps[-1].loss:.3f}, test accuracy "
          f"{epochs[-1].test_accuracy:.3f}", flush=True)

    check(job.id in [j.id for j in c.jobs()], "jobs(): the job is missing")
    check([j.id for j in c.jobs(states=["RUNNING"])] == [], "jobs(RUNNING) is not empty")
    expect_error("INVALID_ARGUMENT", c.jobs, states=["sleeping"])
    done = c.get(job.id)
    check(done.state == "SUCCEEDED" and done.epochs_done == 3 and done.done, f"get: {done}")
    expect_error("NOT_FOUND", c.get, "job-000000000000")
    expect_error("NOT_FOUND", c.checkpoints, "job-000000000000")
    expect_error("FAILED_PRECONDITION", c.cancel, job)
    expect_error("FAILED_PRECONDITION", c.checkpoint, job)

    ckpts = c.checkpoints(job)
    check(ckpts and ckpts[-1].epochs_done == 3 and {"periodic", "best"} <= {k.kind for k in ckpts},
          f"checkpoints: {ckpts}")
    path = os.path.join(tmp, "model.safetensors")
    record = c.export(job, path)
    data = open(path, "rb").read()
    check(len(data) == record.size_bytes and hashlib.sha256(data).hexdigest() == record.sha256,
          "export: the file is not the checkpoint kilnd recorded")
    header = struct.unpack("<Q", data[:8])[0]
    check(data[8:9] == b"{" and 8 + header < len(data), "export: not a safetensors file")
    best = c.export(job, os.path.join(tmp, "best.safetensors"), checkpoint="best")
    check(best.test_accuracy == max(k.test_accuracy for k in ckpts), f"export best: {best}")
    check(not [f for f in os.listdir(tmp) if f.startswith(".kiln-export-")], "export left a temp")

    resumed = c.resume(job, epochs=4)
    check(resumed.state in ("QUEUED", "RUNNING"), f"resume: {resumed}")
    finished = c.wait(job)
    check(finished.state == "SUCCEEDED" and finished.epochs_done == 4, f"wait: {finished}")

    name = c.deploy(job, name="blocks", checkpoint="best", max_batch_size=16)
    check(name == "blocks" and ("blocks", "READY") in [(m.name, m.state) for m in c.models()],
          f"deploy: {c.models()}")
    test_images, test_labels = make_images(64, random.Random(3))
    x = np.frombuffer(test_images, dtype=np.uint8).reshape(64, SIDE, SIDE)
    y = np.frombuffer(test_labels, dtype=np.uint8)
    probabilities, classes = c.predict("blocks", x)
    check(probabilities.shape == (64, CLASSES) and probabilities.dtype == np.float32 and
          classes.shape == (64,) and classes.dtype == np.int64, "predict: shapes or dtypes")
    check(np.allclose(probabilities.sum(axis=1), 1, atol=1e-4), "predict: rows do not sum to 1")
    check(np.array_equal(classes, probabilities.argmax(axis=1)), "predict: class is not argmax")
    accuracy = float((classes == y).mean())
    check(accuracy > 0.9, f"predict: accuracy {accuracy}")
    p32, c32 = c.predict("blocks", x.astype(np.float32) / 255)  # FP32 in [0, 1]
    check(np.array_equal(c32, classes) and np.allclose(p32, probabilities, atol=1e-4),
          "predict: FP32 and UINT8 answers differ")
    one_p, one_c = c.predict("blocks", x[5])  # one sample, no batch dimension
    version = next(m.version for m in c.models() if m.name == "blocks")
    check(np.array_equal(c.predict("blocks", x[:4], version=version)[1], classes[:4]),
          f"predict: version {version}")
    check(one_p.shape == (1, CLASSES) and one_c[0] == classes[5], "predict: one sample")
    expect_error("INVALID_ARGUMENT", c.predict, "blocks", np.zeros((2, 7), np.uint8))
    expect_error("NOT_FOUND", c.predict, "no-such-model", x)
    print(f"predicted {len(x)} new samples: accuracy {accuracy:.3f}", flush=True)
    # Versions are numbered per model; a policy of latest:1 keeps only the newest.
    c.deploy(job, name="blocks", checkpoint="latest", version_policy="latest:1", follow=True)
    versions = [m.version for m in c.models() if m.name == "blocks"]
    check(versions == ["2"], f"deploy with version_policy latest:1: versions {versions}")
    expect_error("INVALID_ARGUMENT", c.deploy, job, name="blocks", version_policy="newest")
    # A bf16 version says so and answers close to the fp32 one (GEMM inputs in bfloat16).
    check(c.model_precision("blocks") == "fp32", f"precision: {c.model_precision('blocks')}")
    c.deploy(job, name="blocks-bf16", checkpoint="latest", precision="bf16")
    check(c.model_precision("blocks-bf16") == "bf16",
          f"precision bf16: {c.model_precision('blocks-bf16')}")
    p16, _ = c.predict("blocks-bf16", x)
    p32_latest, _ = c.predict("blocks", x)
    check(np.allclose(p16, p32_latest, atol=2e-2), "predict: bf16 far from fp32")
    expect_error("INVALID_ARGUMENT", c.deploy, job, name="blocks-bf16", precision="fp16")
    c.undeploy("blocks-bf16")
    c.undeploy("blocks")
    check(("blocks", "READY") not in [(m.name, m.state) for m in c.models()],
          f"undeploy: still ready: {c.models()}")
    exercise_generate(c)
    c.close()


def exercise_generate(c):
    """A tiny character GPT on the "bard" corpus (10 characters), deployed; generate() returns
    the text, stream=True the same tokens one by one (the same seed)."""
    layers = [
        {"name": "wte", "embedding": {"num_embeddings": 10, "embedding_dim": 16}},
        {"name": "wpe", "position_embedding": {"block_size": 8, "embedding_dim": 16}},
        {"name": "h.0.ln_1", "layernorm": {"normalized_shape": 16}},
        {"name": "h.0.attn", "causal_self_attention": {"n_head": 2, "n_embd": 16}},
        {"name": "h.0.res_1", "add": {}, "inputs": ["wpe", "h.0.attn"]},
        {"name": "ln_f", "layernorm": {"normalized_shape": 16}},
        {"name": "lm_head", "linear": {"in_features": 16, "out_features": 10, "bias": False}},
    ]
    job = c.submit({"model": {"input_shape": [8], "layers": layers},
                    "optimizer": {"kind": "adamw", "lr": 0.001}, "dataset": "bard",
                    "batch_size": 2, "max_iters": 3})
    check(c.wait(job).state == "SUCCEEDED", f"gpt job: {c.get(job)}")
    c.deploy(job, name="bard")
    text = c.generate("bard", "to be", max_tokens=9, temperature=0.9, seed=2)
    check(isinstance(text, str) and len(text) == 9, f"generate: {text!r}")
    pieces = list(c.generate("bard", "to be", max_tokens=9, temperature=0.9, seed=2, stream=True))
    check(len(pieces) == 9 and "".join(pieces) == text, f"generate stream: {pieces} vs {text!r}")
    expect_error("INVALID_ARGUMENT", c.generate, "bard", "to bZ")
    expect_error("INVALID_ARGUMENT", c.generate, "bard", "to be", temperature=-1)
    c.undeploy("bard")


def run_example(addr, pythonpath, tmp):
    """examples/python_train_and_predict.py --synthetic trains, plots a PNG and predicts."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("no matplotlib: the example not run (apt-get install python3-matplotlib)")
        return
    png = os.path.join(tmp, "loss.png")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "python_train_and_predict.py"),
         "--server", addr, "--token", TOKEN, "--synthetic", "--plot", png],
        env=dict(os.environ, PYTHONPATH=pythonpath), capture_output=True, text=True, timeout=120)
    check(out.returncode == 0, f"the example exited {out.returncode}:\n{out.stdout}{out.stderr}")
    check(open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "the example wrote no PNG")
    m = re.search(r"accuracy on 16: (\d+)%", out.stdout)
    check(m and int(m.group(1)) >= 75, f"the example's predictions:\n{out.stdout}")
    print(f"the example trained, plotted {os.path.basename(png)} and predicted "
          f"({m.group(0)})", flush=True)


def tls_files(tmp):
    """A CA and a certificate for 127.0.0.1 signed by it, with the openssl CLI, or None."""
    if shutil.which("openssl") is None:
        return None
    d = os.path.join(tmp, "tls")
    os.makedirs(d)

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=kiln test CA", "-keyout", "ca.key",
            "-out", "ca.pem")
    openssl("req", *ec, "-subj", "/CN=kilnd", "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    return d


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kilnd, pythonpath = sys.argv[1], sys.argv[2]
    try:
        import grpc  # noqa: F401
        import numpy as np
    except ImportError as e:
        print(f"SKIP: {sys.executable} cannot import {e.name} (apt-get install python3-grpcio "
              "python3-numpy)")
        return 77
    sys.path.insert(0, pythonpath)
    os.environ.pop("KILN_TOKEN", None)
    os.environ.pop("KILN_SERVER", None)
    import kiln

    tmp = tempfile.mkdtemp(prefix="kiln-python-client-")
    rng = random.Random(17)
    os.makedirs(os.path.join(tmp, "blocks"))
    write_idx(os.path.join(tmp, "blocks"), "train", *make_images(512, rng), 512)
    write_idx(os.path.join(tmp, "blocks"), "test", *make_images(128, rng), 128)
    with open(os.path.join(tmp, "tokens"), "w") as f:
        f.write(f"# the test's client\n{TOKEN} user=pat team=vision role=member\n")
    procs = []
    try:
        proc, addr = start_kilnd(kilnd, tmp, "plain", "--auth_tokens_file",
                                 os.path.join(tmp, "tokens"))
        procs.append(proc)
        exercise(kiln, np, addr, tmp)
        run_example(addr, pythonpath, tmp)

        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        expect_error("UNAVAILABLE", kiln.Client, dead, connect_timeout=1)

        tls = tls_files(tmp)
        if tls is None:
            print("no openssl: TLS not checked", flush=True)
        else:
            proc, addr = start_kilnd(kilnd, tmp, "tls", "--tls_cert",
                                     os.path.join(tls, "server.pem"), "--tls_key",
                                     os.path.join(tls, "server.key"))
            procs.append(proc)
            with kiln.Client(addr, tls_ca=os.path.join(tls, "ca.pem")) as c:
                check(c.jobs() == [], "TLS: a fresh kilnd has jobs")
            expect_error("UNAVAILABLE", kiln.Client, addr, connect_timeout=1)  # plaintext
            print("TLS: connected with tls_ca; a plaintext client is refused", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
