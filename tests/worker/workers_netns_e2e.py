#!/usr/bin/python3
"""A job of two workers on "several nodes": network namespaces on one machine.

  tests/worker/workers_netns_e2e.py KILND KILN KILN_WORKER

Makes three network namespaces joined by veth pairs to a bridge (10.77.0.1-3/24, in a fourth
namespace that plays the switch): kilnd listens on 10.77.0.1 in the first; rank 0 and rank 1 run
in the second and third with --gloo_host 10.77.0.2 and 10.77.0.3 and no data dir (each fetches
the dataset from kilnd), so every byte between them crosses a "network" link. Checks that both
exit 0 and the job SUCCEEDED with an epoch event per epoch. Exits 77 (skipped) where namespaces
cannot be made (`ip netns add` needs root or CAP_NET_ADMIN).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worker_e2e_support import (Kiln, fail, make_idx_dataset, read, start_worker,  # noqa: E402
                                wait_exit)

EPOCHS = 2


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


class Namespaces:
    """Node namespaces 1..n at 10.77.0.i/24 on a bridge; names unique to this process."""

    def __init__(self, n):
        self.tag = str(os.getpid())
        self.hub = "kwh" + self.tag
        self.nodes = [f"kw{i}-{self.tag}" for i in range(1, n + 1)]

    def make(self):
        steps = [["netns", "add", self.hub],
                 ["-n", self.hub, "link", "add", "br0", "type", "bridge"],
                 ["-n", self.hub, "link", "set", "br0", "up"]]
        for i, ns in enumerate(self.nodes, start=1):
            node_end, hub_end = f"kv{i}-{self.tag}", f"kb{i}-{self.tag}"
            steps += [["netns", "add", ns],
                      ["link", "add", node_end, "type", "veth", "peer", "name", hub_end],
                      ["link", "set", node_end, "netns", ns],
                      ["link", "set", hub_end, "netns", self.hub],
                      ["-n", self.hub, "link", "set", hub_end, "master", "br0"],
                      ["-n", self.hub, "link", "set", hub_end, "up"],
                      ["-n", ns, "addr", "add", f"10.77.0.{i}/24", "dev", node_end],
                      ["-n", ns, "link", "set", node_end, "up"],
                      ["-n", ns, "link", "set", "lo", "up"]]
        for step in steps:
            out = ip(*step)
            if out.returncode != 0:
                return f"ip {' '.join(step)}: {out.stderr.strip()}"
        return ""

    def remove(self):
        for ns in self.nodes + [self.hub]:
            ip("netns", "del", ns)  # takes its veth ends with it

    def exec_prefix(self, node):
        return ["ip", "netns", "exec", self.nodes[node - 1]]


def start_kilnd_in(prefix, kilnd, folder, address):
    os.makedirs(folder, exist_ok=True)
    out_path = os.path.join(folder, "kilnd.out")
    proc = subprocess.Popen(
        prefix + [kilnd, "--listen", f"{address}:0", "--state_dir", os.path.join(folder, "state"),
                  "--data_dir", os.path.join(folder, "data"), "--device", "cpu"],
        stdout=open(out_path, "w"), stderr=open(os.path.join(folder, "kilnd.log"), "w"))
    for _ in range(600):
        m = re.search(r"^kilnd: listening on port (\d+)$", read(out_path), re.M)
        if m:
            return proc, f"{address}:{m.group(1)}"
        if proc.poll() is not None:
            fail("kilnd exited:\n" + read(os.path.join(folder, "kilnd.log")))
        time.sleep(0.1)
    proc.kill()
    fail("kilnd did not report its port")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kilnd, kiln_bin, worker = sys.argv[1:]
    nets = Namespaces(3)
    why = nets.make()
    if why:
        nets.remove()
        print(f"SKIP: cannot make network namespaces (needs root or CAP_NET_ADMIN): {why}")
        return 77
    tmp = tempfile.mkdtemp(prefix="kiln-worker-netns-")
    proc = None
    try:
        data = make_idx_dataset(os.path.join(tmp, "upload"))
        proc, address = start_kilnd_in(nets.exec_prefix(1), kilnd, os.path.join(tmp, "kilnd"),
                                       "10.77.0.1")
        kiln = Kiln(kiln_bin, address, prefix=nets.exec_prefix(1))
        kiln.run("upload", "tiny",
                 "--train-images", os.path.join(data, "train-images-idx3-ubyte"),
                 "--train-labels", os.path.join(data, "train-labels-idx1-ubyte"),
                 "--test-images", os.path.join(data, "t10k-images-idx3-ubyte"),
                 "--test-labels", os.path.join(data, "t10k-labels-idx1-ubyte"))
        job = kiln.submit({"preset": "mnist-mlp", "dataset": "tiny", "epochs": EPOCHS,
                           "batchSize": 32, "device": "cpu", "workers": 2,
                           "externalWorkers": True}, tmp)
        token = kiln.run("worker-token", job).stdout.strip()
        ranks = []
        for rank in (0, 1):
            node = rank + 2
            log = os.path.join(tmp, f"rank{rank}.log")
            ranks.append((rank, log, start_worker(
                worker, address, job, rank, token, log,
                ["--gloo_host", f"10.77.0.{node}", "--cache_dir",
                 os.path.join(tmp, f"node{node}-cache")], prefix=nets.exec_prefix(node))))
        for rank, log, p in ranks:
            code = wait_exit(p, 180, f"rank {rank}")
            if code != 0:
                fail(f"rank {rank} exited {code}:\n{read(log)}")
        state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
        if "SUCCEEDED" not in state:
            fail(f"job {job} ended {state}:\n{kiln.run('get', job).stdout}")
        epochs = [e.get("epoch") for e in kiln.epoch_events(job)]
        if epochs != list(range(1, EPOCHS + 1)):
            fail(f"epoch events for epochs {epochs}, not 1..{EPOCHS}")
        print(f"job {job} of ranks in two namespaces succeeded", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        nets.remove()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
