"""What the kiln-worker end-to-end tests share: a small IDX dataset, the kiln CLI against one
kilnd, workers started by hand (as on another machine) and waiting for them with a deadline.
"""
import json
import os
import random
import struct
import subprocess
import time


def fail(message):
    print("FAIL: " + message, flush=True)
    raise SystemExit(1)


def make_idx_dataset(folder, train=320, test=100, seed=20):
    """MNIST-shaped IDX files: class k lights a band of rows k*2..k*2+4 over faint noise, so two
    epochs learn much of it."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)

    def write(prefix, n):
        labels = [rng.randrange(10) for _ in range(n)]
        images = bytearray()
        for k in labels:
            pixels = bytearray(rng.randrange(40) for _ in range(784))
            for i in range(k * 56, k * 56 + 112):
                pixels[i] = 150 + rng.randrange(100)
            images += pixels
        with open(os.path.join(folder, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 28, 28) + images)
        with open(os.path.join(folder, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + bytes(labels))

    write("train", train)
    write("t10k", test)
    return folder


class Kiln:
    """The kiln CLI against one kilnd; `prefix` runs it through a wrapper (ip netns exec NS),
    `env` adds environment variables (KILN_TLS_CA)."""

    def __init__(self, kiln, address, prefix=(), env=None):
        self.kiln, self.address, self.prefix = kiln, address, list(prefix)
        self.env = dict(env or {})

    def run(self, *args, check=True):
        out = subprocess.run(self.prefix + [self.kiln, *args],
                             env=dict(os.environ, KILN_SERVER=self.address, **self.env),
                             capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            fail(f"kiln {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
        return out

    def json(self, *args):
        return json.loads(self.run("--output", "json", *args).stdout)

    def submit(self, spec, folder):
        path = os.path.join(folder, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return self.json("submit", path)["id"]

    def state(self, job):
        return self.json("get", job).get("state", "")

    def wait_state(self, job, states, seconds=120):
        deadline = time.time() + seconds
        while time.time() < deadline:
            state = self.state(job)
            if any(s in state for s in states):
                return state
            time.sleep(0.3)
        fail(f"job {job} did not reach {states} within {seconds} s: {self.run('get', job).stdout}")

    def epoch_events(self, job):
        """The job's epoch events, from its history (the job has ended)."""
        lines = self.run("--output", "json", "watch", job).stdout.splitlines()
        return [json.loads(line)["epoch"] for line in lines
                if line.startswith("{") and isinstance(json.loads(line).get("epoch"), dict)]


def start_worker(worker, address, job, rank, token, log_path, extra=(), prefix=(), env=None):
    """A kiln-worker as one started by hand; the token only in the environment."""
    env = dict(os.environ, **(env or {}))
    env.pop("KILN_WORKER_TOKEN", None)
    if token is not None:
        env["KILN_WORKER_TOKEN"] = token
    log = open(log_path, "w")
    return subprocess.Popen(list(prefix) + [worker, "--coordinator", address, "--job", job,
                                            "--rank", str(rank), *extra],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_exit(proc, seconds, what):
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail(f"{what} did not exit within {seconds} s")


def read(path):
    with open(path) as f:
        return f.read()
