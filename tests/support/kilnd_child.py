"""kilnd as a child process of a Python test, as tests/support/kilnd_child.cc is for C++ tests.

  proc, address = start_kilnd(KILND, FOLDER, *flags)

starts KILND on FOLDER/state and FOLDER/data (--device cpu, a free port), writes its stdout and
stderr to FOLDER/kilnd.out and FOLDER/kilnd.log, and returns the process and "127.0.0.1:PORT"
once kilnd says "kilnd: listening on port N". RuntimeError (with kilnd's log) when it exits or
says nothing for 60 s; the caller terminates the process.
"""
import os
import re
import subprocess
import time


def start_kilnd(kilnd, folder, *flags):
    os.makedirs(folder, exist_ok=True)
    out = open(os.path.join(folder, "kilnd.out"), "w+")
    log = os.path.join(folder, "kilnd.log")
    proc = subprocess.Popen(
        [kilnd, "--listen", "127.0.0.1:0", "--state_dir", os.path.join(folder, "state"),
         "--data_dir", os.path.join(folder, "data"), "--device", "cpu", *flags],
        stdout=out, stderr=open(log, "w"))
    for _ in range(600):
        out.seek(0)
        m = re.search(r"^kilnd: listening on port (\d+)$", out.read(), re.M)
        if m:
            return proc, "127.0.0.1:" + m.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"kilnd exited:\n{open(log).read()}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("kilnd did not report its port")
