#!/usr/bin/python3
"""kilnd's commands reach every kiln-worker at one step, and a stopped worker stops its job.

  tests/worker/workers_stop_e2e.py KILND KILN KILN_WORKER

kilnd runs with --step_delay, so the jobs below are still training when the test acts. A job of
two external workers: `kiln checkpoint` gets an on-demand checkpoint from rank 0, then
`kiln cancel` makes both workers write a cancel checkpoint (rank 0) and exit non-zero, and the
job ends CANCELLED. A second job: SIGTERM to rank 1 stops it within seconds, rank 0 follows
(its peer is gone), and the job fails naming a rank. A third: kilnd shuts down (SIGTERM), both workers stop and rank 0
writes a shutdown checkpoint; kilnd restarts, two new workers continue from that checkpoint and
the job succeeds.
"""
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
sys.path.insert(0, HERE)
from kilnd_child import start_kilnd  # noqa: E402
from worker_e2e_support import (Kiln, fail, make_idx_dataset, read, start_worker,  # noqa: E402
                                wait_exit)

SPEC = {"preset": "mnist-mlp", "dataset": "tiny", "epochs": 20, "batchSize": 32, "device": "cpu",
        "workers": 2, "externalWorkers": True}


def start_ranks(worker, address, job, token, tmp, name):
    data_dir = os.path.join(tmp, "kilnd", "data")
    return [start_worker(worker, address, job, r, token, os.path.join(tmp, f"{name}{r}.log"),
                         ["--data_dir", data_dir]) for r in (0, 1)]


def start_job(kiln, worker, address, tmp, name, spec=SPEC):
    job = kiln.submit(spec, tmp)
    token = kiln.run("worker-token", job).stdout.strip()
    ranks = start_ranks(worker, address, job, token, tmp, name)
    deadline = time.time() + 120
    while int(kiln.json("get", job).get("global_step", 0)) < 3:
        if time.time() > deadline or any(p.poll() is not None for p in ranks):
            fail(f"job {job} did not train:\n" + "".join(
                read(os.path.join(tmp, f"{name}{r}.log")) for r in (0, 1)))
        time.sleep(0.2)
    return job, ranks


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kilnd, kiln_bin, worker = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="kiln-worker-stop-")
    data = make_idx_dataset(os.path.join(tmp, "upload"))
    proc, address = start_kilnd(kilnd, os.path.join(tmp, "kilnd"), "--step_delay", "50ms")
    kiln = Kiln(kiln_bin, address)
    try:
        kiln.run("upload", "tiny",
                 "--train-images", os.path.join(data, "train-images-idx3-ubyte"),
                 "--train-labels", os.path.join(data, "train-labels-idx1-ubyte"),
                 "--test-images", os.path.join(data, "t10k-images-idx3-ubyte"),
                 "--test-labels", os.path.join(data, "t10k-labels-idx1-ubyte"))

        # Checkpoint now, then cancel.
        job, ranks = start_job(kiln, worker, address, tmp, "cancel")
        on_demand = kiln.json("checkpoint", job)
        if "ON_DEMAND" not in on_demand.get("kind", ""):
            fail(f"kiln checkpoint answered {on_demand}")
        kiln.run("cancel", job)
        for r, p in enumerate(ranks):
            if wait_exit(p, 60, f"cancelled rank {r}") == 0:
                fail(f"cancelled rank {r} exited 0")
        state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
        if "CANCELLED" not in state:
            fail(f"cancelled job {job} ended {state}")
        kinds = [c.get("kind", "") for c in kiln.json("checkpoints", job).get("checkpoints", [])]
        if not any("ON_DEMAND" in k for k in kinds) or not any("CANCEL" in k for k in kinds):
            fail(f"cancelled job {job} has checkpoints {kinds}:\n" +
                 "".join(read(os.path.join(tmp, f"cancel{r}.log")) for r in (0, 1)))
        print(f"job {job}: checkpoint now and cancel reached both ranks", flush=True)

        # SIGTERM to one worker.
        job, ranks = start_job(kiln, worker, address, tmp, "term")
        ranks[1].send_signal(signal.SIGTERM)
        if wait_exit(ranks[1], 10, "rank 1 after SIGTERM") == 0:
            fail("rank 1 exited 0 after SIGTERM")
        if wait_exit(ranks[0], 60, "rank 0 after its peer stopped") == 0:
            fail("rank 0 exited 0 without its peer")
        state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
        got = kiln.json("get", job)
        if "FAILED" not in state or "rank" not in got.get("reason", ""):
            fail(f"job {job} ended {state}, reason {got.get('reason')!r}")
        print(f"job {job}: SIGTERM to rank 1 failed it: {got.get('reason')}", flush=True)

        # kilnd shuts down: both ranks stop with a shutdown checkpoint; after a restart, two new
        # workers continue from it and the job succeeds.
        short = dict(SPEC, epochs=4)
        job, ranks = start_job(kiln, worker, address, tmp, "shutdown", short)
        token = kiln.run("worker-token", job).stdout.strip()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        for r, p in enumerate(ranks):
            if wait_exit(p, 60, f"rank {r} after kilnd's shutdown") == 0:
                fail(f"rank {r} exited 0 when kilnd shut down")
        proc, address = start_kilnd(kilnd, os.path.join(tmp, "kilnd"), "--step_delay", "50ms")
        kiln = Kiln(kiln_bin, address)
        kinds = [c.get("kind", "") for c in kiln.json("checkpoints", job).get("checkpoints", [])]
        if kinds != ["CHECKPOINT_KIND_SHUTDOWN"]:
            fail(f"job {job} has checkpoints {kinds} after kilnd's shutdown:\n" +
                 "".join(read(os.path.join(tmp, f"shutdown{r}.log")) for r in (0, 1)))
        ranks = start_ranks(worker, address, job, token, tmp, "restarted")
        for r, p in enumerate(ranks):
            if wait_exit(p, 120, f"rank {r} after the restart") != 0:
                fail(f"rank {r} failed after the restart:\n" +
                     read(os.path.join(tmp, f"restarted{r}.log")))
        state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
        got = kiln.json("get", job)
        if "SUCCEEDED" not in state or int(got.get("resumed_from_step", 0)) == 0:
            fail(f"job {job} ended {state} after the restart: {got}")
        print(f"job {job}: stopped by kilnd's shutdown, resumed from step "
              f"{got['resumed_from_step']} after its restart", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
