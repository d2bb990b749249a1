#!/usr/bin/python3
"""kiln-worker reaches a kilnd that serves TLS.

  tests/worker/workers_tls_e2e.py KILND KILN KILN_WORKER

Makes a CA and a certificate for 127.0.0.1 with the openssl CLI, starts kilnd with them, and
runs a job of two external workers: rank 0 gets the CA from --tls_ca, rank 1 from KILN_TLS_CA
(the variable the kiln CLI reads too). Both must exit 0 and the job succeed. Exits 77 (skipped)
where /usr/bin/openssl is missing.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
sys.path.insert(0, HERE)
from kilnd_child import start_kilnd  # noqa: E402
from worker_e2e_support import (Kiln, fail, make_idx_dataset, read, start_worker,  # noqa: E402
                                wait_exit)

OPENSSL = "/usr/bin/openssl"


def openssl(*args):
    out = subprocess.run([OPENSSL, *args], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"openssl {' '.join(args)}: {out.stderr}")


def make_certificates(folder):
    """A CA and a server certificate it signed for IP 127.0.0.1; returns (ca, cert, key)."""
    ca_key, ca = os.path.join(folder, "ca.key"), os.path.join(folder, "ca.pem")
    key, csr, cert = (os.path.join(folder, n) for n in ("kilnd.key", "kilnd.csr", "kilnd.pem"))
    ext = os.path.join(folder, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=kiln test CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", "/CN=kilnd")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-days", "2", "-extfile", ext)
    return ca, cert, key


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kilnd, kiln_bin, worker = sys.argv[1:]
    if not os.access(OPENSSL, os.X_OK):
        print(f"SKIP: {OPENSSL} is missing (apt-get install openssl)")
        return 77
    tmp = tempfile.mkdtemp(prefix="kiln-worker-tls-")
    ca, cert, key = make_certificates(tmp)
    data = make_idx_dataset(os.path.join(tmp, "upload"))
    proc, address = start_kilnd(kilnd, os.path.join(tmp, "kilnd"), "--tls_cert", cert,
                                "--tls_key", key)
    kiln = Kiln(kiln_bin, address, env={"KILN_TLS_CA": ca})
    try:
        kiln.run("upload", "tiny",
                 "--train-images", os.path.join(data, "train-images-idx3-ubyte"),
                 "--train-labels", os.path.join(data, "train-labels-idx1-ubyte"),
                 "--test-images", os.path.join(data, "t10k-images-idx3-ubyte"),
                 "--test-labels", os.path.join(data, "t10k-labels-idx1-ubyte"))
        job = kiln.submit({"preset": "mnist-mlp", "dataset": "tiny", "epochs": 1,
                           "batchSize": 32, "device": "cpu", "workers": 2,
                           "externalWorkers": True}, tmp)
        token = kiln.run("worker-token", job).stdout.strip()
        logs = [os.path.join(tmp, f"rank{r}.log") for r in (0, 1)]
        ranks = [start_worker(worker, address, job, 0, token, logs[0],
                              ["--tls_ca", ca, "--cache_dir", os.path.join(tmp, "cache")]),
                 start_worker(worker, address, job, 1, token, logs[1],
                              ["--cache_dir", os.path.join(tmp, "cache")],
                              env={"KILN_TLS_CA": ca})]
        for r, p in enumerate(ranks):
            if wait_exit(p, 120, f"rank {r}") != 0:
                fail(f"rank {r} failed over TLS:\n{read(logs[r])}")
        state = kiln.wait_state(job, ["SUCCEEDED", "FAILED", "CANCELLED"])
        if "SUCCEEDED" not in state:
            fail(f"job {job} ended {state}:\n{kiln.run('get', job).stdout}")
        print(f"job {job}: two workers over TLS succeeded", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
