"""Podman as the container test drives it: every container, volume and network it makes is
recorded by id and removed by id at the end, and each step is timed in the log."""

import contextlib
import json
import subprocess
import sys
import time


class StepFailed(Exception):
    pass


def log(message):
    print(f"container-test: {message}", flush=True)


@contextlib.contextmanager
def step(name):
    """Logs the step's start and how long it took, or that it failed."""
    log(f"{name} ...")
    start = time.monotonic()
    try:
        yield
    except Exception:
        log(f"{name}: FAILED after {time.monotonic() - start:.1f} s")
        raise
    log(f"{name}: ok ({time.monotonic() - start:.1f} s)")


def run(command, check=True, timeout=300, env=None):
    """Runs a command; its stdout, or StepFailed naming it with its output."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        raise StepFailed(f"{' '.join(command)} exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def wait_for(what, probe, timeout_s, interval_s=0.5):
    """Calls probe() until it returns something true; StepFailed naming `what` at the timeout."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as error:  # the probe's own failure, kept for the message
            last = error
        if time.monotonic() > deadline:
            raise StepFailed(f"{what} within {timeout_s} s" + (f" (last error: {last})"
                                                                 if last else ""))
        time.sleep(interval_s)


class Podman:
    """Creates containers and volumes, and removes every one of them (by id) in close()."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.containers = []
        self.volumes = []
        self.networks = []

    def __call__(self, *args, check=True, timeout=300):
        return run(["podman", *args], check=check, timeout=timeout)

    def create_volume(self, name):
        volume = self("volume", "create", f"{self.prefix}-{name}").strip()
        self.volumes.append(volume)
        return volume

    def start(self, name, image, *options):
        """Starts a detached container; its id."""
        cid = self("run", "-d", "--name", f"{self.prefix}-{name}", *options, image).strip()
        self.containers.append(cid)
        return cid

    def host_port(self, cid, container_port):
        """The 127.0.0.1 port published for a container port."""
        line = self("port", cid, f"{container_port}/tcp").strip().splitlines()[0]
        return int(line.rsplit(":", 1)[1])

    def inspect(self, what, name):
        return json.loads(self(what, "inspect", name))[0]

    def logs(self, cid):
        """The container's stdout and stderr, apart (podman interleaves them mid-line)."""
        done = subprocess.run(["podman", "logs", cid], capture_output=True, text=True,
                              timeout=60)
        return done.stdout, done.stderr

    def adopt_labelled(self, label):
        """Records the containers, volumes and networks carrying `label` (compose's project)."""
        listings = ((self.containers, ("ps", "-a", "--format", "{{.ID}}")),
                    (self.volumes, ("volume", "ls", "--format", "{{.Name}}")),
                    (self.networks, ("network", "ls", "--format", "{{.ID}}")))
        for ids, listing in listings:
            for ident in self(*listing, "--filter", f"label={label}").split():
                if ident not in ids:
                    ids.append(ident)

    def close(self):
        """Removes what this session made, containers first; reports what could not go."""
        leftovers = []
        for kind, ids in (("container", self.containers), ("volume", self.volumes),
                          ("network", self.networks)):
            for ident in ids:
                extra = ["--force", "--time", "5"] if kind == "container" else ["--force"]
                done = subprocess.run(["podman", kind, "rm", *extra, ident],
                                      capture_output=True, text=True, timeout=120)
                if done.returncode != 0 and "no such" not in done.stderr.lower():
                    leftovers.append(f"{kind} {ident}: {done.stderr.strip()}")
        log(f"removed {len(self.containers)} containers, {len(self.volumes)} volumes and "
            f"{len(self.networks)} networks by id")
        for line in leftovers:
            print(f"container-test: could not remove {line}", file=sys.stderr)
        return not leftovers
