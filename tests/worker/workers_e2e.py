#!/usr/bin/python3
"""kiln-worker end to end against a real kilnd on 127.0.0.1.

  tests/worker/workers_e2e.py KILND KILN KILN_WORKER

Uploads a small IDX dataset, submits a job of two external workers (the spec's workers: 2,
externalWorkers: true), takes its token from `kiln worker-token`, and checks that a worker with a
wrong token, one with a rank outside the job and one without a token are refused with a clear
message; then starts ranks 0 (which fetches the dataset from kilnd) and 1 (which reads kilnd's
data dir) by hand and checks that both exit 0, the job SUCCEEDED with an epoch event per epoch
and a checkpoint at its last step, and the fetched files are the uploaded ones, and that its
epochs' losses and accuracy agree with the same spec trained in kilnd's process. Then resumes the
job for one more epoch with two new workers (rank 0 reads the final checkpoint from kilnd) and
checks it continued from the final step. Last, a job of two workers that kilnd starts itself
(kiln-worker beside kilnd) succeeds the same way.
"""
import filecmp
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
sys.path.insert(0, HERE)
from kilnd_child import start_kilnd  # noqa: E402
from worker_e2e_support import (Kiln, fail, make_idx_dataset, read, start_worker,  # noqa: E402
                                wait_exit)

EPOCHS = 2


def spec(external):
    return {"preset": "mnist-mlp", "dataset": "tiny", "epochs": EPOCHS, "batchSize": 32,
            "device": "cpu", "workers": 2, "externalWorkers": external}


def check_succeeded(kiln, job, epochs=EPOCHS):
    state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
    if "SUCCEEDED" not in state:
        fail(f"job {job} ended {state}:\n{kiln.run('get', job).stdout}")
    seen = [e.get("epoch") for e in kiln.epoch_events(job)]
    if seen != list(range(1, epochs + 1)):
        fail(f"job {job}: epoch events for epochs {seen}, not 1..{epochs}")
    got = kiln.json("get", job)
    checkpoints = kiln.json("checkpoints", job).get("checkpoints", [])
    steps = [int(c.get("global_step", 0)) for c in checkpoints]
    if int(got.get("global_step", -1)) not in steps:
        fail(f"job {job}: no checkpoint at its last step {got.get('global_step')}: {checkpoints}"
             f"\n{got}")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kilnd, kiln_bin, worker = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="kiln-worker-e2e-")
    data = make_idx_dataset(os.path.join(tmp, "upload"))
    proc, address = start_kilnd(kilnd, os.path.join(tmp, "kilnd"))
    kiln = Kiln(kiln_bin, address)
    try:
        kiln.run("upload", "tiny",
                 "--train-images", os.path.join(data, "train-images-idx3-ubyte"),
                 "--train-labels", os.path.join(data, "train-labels-idx1-ubyte"),
                 "--test-images", os.path.join(data, "t10k-images-idx3-ubyte"),
                 "--test-labels", os.path.join(data, "t10k-labels-idx1-ubyte"))
        job = kiln.submit(spec(external=True), tmp)
        token = kiln.run("worker-token", job).stdout.strip()
        if not token:
            fail("kiln worker-token printed nothing")

        def worker_log(name):
            return os.path.join(tmp, name + ".log")

        # Refusals, each one line that says what is wrong.
        p = start_worker(worker, address, job, 0, "not-the-token", worker_log("wrong-token"))
        if wait_exit(p, 60, "a worker with a wrong token") == 0:
            fail("a worker with a wrong token exited 0")
        if "joining job" not in read(worker_log("wrong-token")):
            fail("wrong token: " + read(worker_log("wrong-token")))
        p = start_worker(worker, address, job, 2, token, worker_log("rank-2"))
        code = wait_exit(p, 60, "a worker of rank 2 in a job of 2")
        text = read(worker_log("rank-2"))
        if code not in (1, 2) or "rank 2" not in text:
            fail(f"rank 2 of 2 exited {code}: {text}")
        p = start_worker(worker, address, job, 1, None, worker_log("no-token"))
        if wait_exit(p, 30, "a worker without a token") != 2 or \
                "KILN_WORKER_TOKEN" not in read(worker_log("no-token")):
            fail("no token: " + read(worker_log("no-token")))

        # The job's two ranks, started by hand as on other machines.
        cache = os.path.join(tmp, "cache")
        rank0 = start_worker(worker, address, job, 0, token, worker_log("rank0"),
                             ["--cache_dir", cache, "--threads", "1"])
        rank1 = start_worker(worker, address, job, 1, token, worker_log("rank1"),
                             ["--data_dir", os.path.join(tmp, "kilnd", "data")],
                             env={"KILN_THREADS": "1"})
        def wait_ranks(ranks, log_suffix=""):
            for rank, p in ranks:
                code = wait_exit(p, 180, f"rank {rank}")
                if code != 0:
                    fail(f"rank {rank} exited {code}:\n"
                         f"{read(worker_log(f'rank{rank}{log_suffix}'))}")

        wait_ranks(((0, rank0), (1, rank1)))
        check_succeeded(kiln, job)
        for rank in (0, 1):
            if "training on cpu, threads=1" not in read(worker_log(f"rank{rank}")):
                fail(f"rank {rank} did not take 1 thread:\n{read(worker_log(f'rank{rank}'))}")
        final_step = int(kiln.json("get", job)["global_step"])
        two_ranks = kiln.epoch_events(job)

        # The same spec in kilnd's own process: data-parallel training is the same mathematics
        # at the same global batch, so the epochs' numbers agree up to the order of float sums.
        single = kiln.submit(dict(spec(external=False), workers=1), tmp)
        check_succeeded(kiln, single)
        for two, one in zip(two_ranks, kiln.epoch_events(single)):
            for key in ("train_loss", "test_loss"):
                if abs(two[key] - one[key]) > 1e-3 * max(1.0, abs(one[key])):
                    fail(f"epoch {one['epoch']}: {key} {two[key]} over two workers, "
                         f"{one[key]} in one process")
            if abs(two["test_accuracy"] - one["test_accuracy"]) > 0.011:
                fail(f"epoch {one['epoch']}: test accuracy {two['test_accuracy']} over two "
                     f"workers, {one['test_accuracy']} in one process")
        fetched = os.path.join(cache, job, "tiny")
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
            if not filecmp.cmp(os.path.join(data, name), os.path.join(fetched, name),
                               shallow=False):
                fail(f"the fetched {name} differs from the uploaded one")
        print(f"external workers: job {job} succeeded", flush=True)

        # One more epoch: a new attempt, whose rank 0 reads the final checkpoint from kilnd
        # (ReadCheckpoint) and hands its state to rank 1.
        kiln.run("resume", job, "--epochs", str(EPOCHS + 1))
        ranks = [(r, start_worker(worker, address, job, r, token, worker_log(f"rank{r}-resumed"),
                                  ["--cache_dir", cache])) for r in (0, 1)]
        wait_ranks(ranks, "-resumed")
        if "resumed from checkpoint" not in read(worker_log("rank0-resumed")):
            fail("rank 0 did not resume:\n" + read(worker_log("rank0-resumed")))
        check_succeeded(kiln, job, EPOCHS + 1)
        resumed = kiln.json("get", job)
        if int(resumed.get("resumed_from_step", 0)) != final_step:
            fail(f"resumed from step {resumed.get('resumed_from_step')}, not {final_step}")
        print(f"external workers: job {job} resumed for epoch {EPOCHS + 1}", flush=True)

        # Workers that kilnd starts on its own machine.
        job = kiln.submit(spec(external=False), tmp)
        check_succeeded(kiln, job)
        print(f"local workers: job {job} succeeded", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
