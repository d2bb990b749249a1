#!/usr/bin/env python3
"""kilnd in its container, driven from the host as a user drives it (scripts/container-test).

1. The image's contract (podman image inspect) against the Dockerfile, the compose file and the
   Kubernetes manifests: user, ports, volume, environment, health check.
2. A container on a fresh volume: health (kiln and the image's HEALTHCHECK), upload a slice of
   MNIST, train a short job and watch it, deploy it, predict over gRPC and REST, the web page,
   /metrics, and every log line JSON under FLAGS_log_format=json.
3. `podman stop` (SIGTERM) while a job trains: kilnd writes its shutdown checkpoint and exits 0.
4. A new container on the same volume: the jobs, their checkpoints and the deployment are there,
   the stopped job resumes, the model still answers.
5. Compose (deploy/docker-compose.yml with tests/container/compose.test.yml over it, driven by
   docker-compose through podman's Docker API): kilnd and Prometheus, whose API shows the kilnd
   target up and a kiln metric with data.
Every container, volume and network made is removed by id at the end.

Usage: container_e2e.py --image IMAGE --prometheus-image IMAGE --kiln KILN --mnist DIR --root ROOT
"""

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from podman_session import Podman, StepFailed, log, run, step, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
GRPC_PORT, HTTP_PORT = 7070, 9464  # the image's, checked against its EXPOSE in step 1


def http(url, body=None, timeout=10):
    """(status, text) of a GET, or of a POST of `body` (a dict, sent as JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cut_idx(source, target, count):
    """Writes the first `count` items of an IDX file (header adjusted) to `target`."""
    with open(source, "rb") as f:
        magic = f.read(4)
        dims = magic[3]
        shape = list(struct.unpack(f">{dims}I", f.read(4 * dims)))
        item = 1
        for d in shape[1:]:
            item *= d
        shape[0] = min(count, shape[0])
        body = f.read(shape[0] * item)
    with open(target, "wb") as f:
        f.write(magic + struct.pack(f">{dims}I", *shape) + body)


class Kiln:
    """The host's kiln CLI against one kilnd."""

    def __init__(self, binary, port):
        self.binary, self.server = binary, f"127.0.0.1:{port}"

    def __call__(self, *args, check=True, timeout=300):
        return run([self.binary, "--server", self.server, *args], check=check, timeout=timeout)

    def json(self, *args):
        return json.loads(self(*args, "--output", "json"))

    def state(self, job):
        return self.json("get", job)["state"]


def check_image_contract(podman, image, root):
    sys.path.insert(0, os.path.join(root, "tests", "deploy"))
    import deploy_checks  # noqa: E402 (beside this test in the source tree)
    inspect = podman.inspect("image", image)
    problems = deploy_checks.check_built_image(root, inspect)
    if problems:
        raise StepFailed("the built image and the deployment files disagree:\n  "
                         + "\n  ".join(problems))
    config = inspect["Config"]
    log(f"image {image}: user {config.get('User')}, ports {sorted(config.get('ExposedPorts'))}, "
        f"volumes {sorted(config.get('Volumes'))}, {inspect['Size'] / 1e6:.0f} MB")


def start_kilnd(podman, args, name, volume):
    """A kilnd container on `volume` with both ports published on loopback; (id, Kiln, http)."""
    cid = podman.start(name, args.image, "-p", f"127.0.0.1::{GRPC_PORT}", "-p",
                       f"127.0.0.1::{HTTP_PORT}", "-v", f"{volume}:/var/lib/kiln",
                       "-e", "FLAGS_log_format=json")
    kiln = Kiln(args.kiln, podman.host_port(cid, GRPC_PORT))
    base = f"http://127.0.0.1:{podman.host_port(cid, HTTP_PORT)}"
    wait_for(f"kilnd in {name} answering `kiln health`", lambda: kiln("health", timeout=10), 60)
    return cid, kiln, base


def check_json_logs(podman, cid, want_events):
    out, err = podman.logs(cid)
    events = []
    for stream, text in (("stdout", out), ("stderr", err)):
        for line in filter(None, text.splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                raise StepFailed(f"{stream} line is not JSON under FLAGS_log_format=json: {line}")
            if not isinstance(record, dict) or "event" not in record:
                raise StepFailed(f"{stream} line has no event: {line}")
            events.append(record)
    names = {e["event"] for e in events}
    missing = set(want_events) - names
    if missing:
        raise StepFailed(f"the logs lack events {sorted(missing)} (have {sorted(names)})")
    return events


def first_container(podman, args, volume, work):
    """Step 2 and 3; the ids of the trained job and of the job stopped by SIGTERM."""
    with step("start kilnd (container 1) and wait for health"):
        cid, kiln, base = start_kilnd(podman, args, "kilnd-1", volume)
        podman("healthcheck", "run", cid)  # the image's HEALTHCHECK; exit 0: healthy
    with step("upload a slice of MNIST (2000 training, 500 test images)"):
        files = {}
        for split, count in (("train", 2000), ("t10k", 500)):
            for kind in ("images-idx3", "labels-idx1"):
                files[f"{split}-{kind}"] = os.path.join(work, f"{split}-{kind}-ubyte")
                cut_idx(os.path.join(args.mnist, f"{split}-{kind}-ubyte"),
                        files[f"{split}-{kind}"], count)
        kiln("upload", "digits", "--train-images", files["train-images-idx3"], "--train-labels",
             files["train-labels-idx1"], "--test-images", files["t10k-images-idx3"],
             "--test-labels", files["t10k-labels-idx1"])
    with step("train the CNN for one epoch and watch it"):
        job = kiln.json("submit", "--preset", "mnist-cnn", "--dataset", "digits", "--epochs",
                        "1", "--name", "container-test")["id"]
        watched = kiln("watch", job, timeout=600)
        if kiln.state(job) != "JOB_STATE_SUCCEEDED" or "SUCCEEDED" not in watched:
            raise StepFailed(f"{job} did not succeed: {watched[-1000:]}")
    with step("deploy; predict over gRPC and REST"):
        kiln("deploy", job, "--name", "digits")
        wait_for("model digits READY", lambda: any(
            m["name"] == "digits" and m["state"] == "READY"
            for m in kiln.json("models")["models"]), 60)
        table = kiln("predict", "digits", files["t10k-images-idx3"], "--index", "0", "1", "2",
                     "--top", "1").splitlines()
        grpc_classes = [row.split()[1] for row in table[1:]]
        with open(files["t10k-images-idx3"], "rb") as f:
            pixels = list(f.read()[16:16 + 784])
        status, text = http(f"{base}/v2/models/digits/infer", {
            "inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 784],
                        "data": pixels}], "outputs": [{"name": "class"}]})
        if status != 200:
            raise StepFailed(f"REST infer answered {status}: {text}")
        rest_class = str(json.loads(text)["outputs"][0]["data"][0])
        log(f"gRPC classes {grpc_classes}, REST class of image 0: {rest_class}")
        if len(grpc_classes) != 3 or grpc_classes[0] != rest_class:
            raise StepFailed(f"gRPC ({table}) and REST ({text}) disagree on image 0")
    with step("the web page and /metrics"):
        status, page = http(f"{base}/")
        if status != 200 or "<html" not in page.lower() or "kiln" not in page.lower():
            raise StepFailed(f"GET / answered {status}: {page[:300]}")
        status, metrics = http(f"{base}/metrics")
        wanted = ("kiln_build_info", "kiln_job_completions_total", f'job_id="{job}"')
        if status != 200 or not all(w in metrics for w in wanted):
            raise StepFailed(f"GET /metrics ({status}) lacks one of {wanted}")
    with step("podman stop (SIGTERM) while a job trains: a shutdown checkpoint"):
        stopped = kiln.json("submit", "--preset", "mnist-cnn", "--dataset", "digits",
                            "--epochs", "200", "--name", "stopped-by-sigterm")["id"]
        wait_for(f"{stopped} training", lambda: int(kiln.json("get", stopped)["global_step"]) > 0,
                 120)
        start = time.monotonic()
        podman("stop", "--time", "45", cid, timeout=120)
        took = time.monotonic() - start
        state = podman.inspect("container", cid)["State"]
        if state.get("ExitCode") != 0:
            raise StepFailed(f"kilnd exited {state.get('ExitCode')} on SIGTERM")
        events = check_json_logs(podman, cid, {"listening", "server_started", "job_submitted",
                                               "epoch_done", "model_deployed", "signal",
                                               "checkpoint_written", "stopped"})
        if not any(e["event"] == "checkpoint_written" and e.get("kind") == "shutdown"
                   and e.get("job") == stopped for e in events):
            raise StepFailed(f"no shutdown checkpoint of {stopped} in the logs")
        log(f"stopped in {took:.1f} s with exit code 0; every log line JSON "
            f"({len(events)} events)")
    return job, stopped


def second_container(podman, args, volume, work, job, stopped):
    """Step 4."""
    with step("a new container on the same volume: jobs, checkpoints, deployment"):
        cid, kiln, base = start_kilnd(podman, args, "kilnd-2", volume)
        if kiln.state(job) != "JOB_STATE_SUCCEEDED":
            raise StepFailed(f"{job} is {kiln.state(job)} after the restart")
        kinds = {c["kind"] for c in kiln.json("checkpoints", job)["checkpoints"]}
        if "CHECKPOINT_KIND_FINAL" not in kinds:
            raise StepFailed(f"{job}'s final checkpoint is gone ({kinds})")
        kinds = {c["kind"] for c in kiln.json("checkpoints", stopped)["checkpoints"]}
        if "CHECKPOINT_KIND_SHUTDOWN" not in kinds:
            raise StepFailed(f"{stopped}'s shutdown checkpoint is gone ({kinds})")
        wait_for("model digits READY again", lambda: any(
            m["name"] == "digits" and m["state"] == "READY"
            for m in kiln.json("models")["models"]), 60)
        got = json.loads(kiln("predict", "digits", os.path.join(work, "t10k-images-idx3-ubyte"),
                              "--index", "0", "--output", "json"))
        if not got:
            raise StepFailed("predict after the restart answered nothing")
        wait_for(f"{stopped} resumed", lambda: kiln.state(stopped) == "JOB_STATE_RUNNING"
                 and int(kiln.json("get", stopped)["resumed_from_step"]) > 0, 120)
        kiln("cancel", stopped)
        podman("stop", "--time", "45", cid, timeout=120)


def compose(podman, args, work):
    """Step 5: deploy/docker-compose.yml's kilnd (cpu profile) and Prometheus."""
    project = os.path.basename(podman.prefix).replace("-", "")
    socket_path = os.path.join(work, "podman.sock")
    service = subprocess.Popen(["podman", "system", "service", "--time=0",
                                f"unix://{socket_path}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for("podman's Docker API socket", lambda: os.path.exists(socket_path), 30)
        ports = {"KILN_GRPC_PORT": free_port(), "KILN_HTTP_PORT": free_port(),
                 "PROMETHEUS_PORT": free_port()}
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
        env.update({k: str(v) for k, v in ports.items()})
        env["DOCKER_HOST"] = f"unix://{socket_path}"
        env["KILN_TEST_IMAGE"] = args.image
        env["KILN_TEST_PROMETHEUS_IMAGE"] = args.prometheus_image
        command = ["docker-compose", "--project-name", project, "--profile", "cpu",
                   "-f", os.path.join(args.root, "deploy/docker-compose.yml"),
                   "-f", os.path.join(HERE, "compose.test.yml")]
        with step("compose up kilnd (cpu profile) and Prometheus"):
            try:
                run(command + ["up", "-d", "--no-build", "kilnd-cpu", "prometheus"], env=env,
                    timeout=300)
            finally:
                podman.adopt_labelled(f"com.docker.compose.project={project}")
            kiln = Kiln(args.kiln, ports["KILN_GRPC_PORT"])
            wait_for("compose's kilnd answering", lambda: kiln("health", timeout=10), 60)
        with step("Prometheus shows the kilnd target up and a kiln metric with data"):
            api = f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}/api/v1"

            def target_up():
                targets = json.loads(http(f"{api}/targets")[1])["data"]["activeTargets"]
                kilnd = [t for t in targets if t["labels"].get("job") == "kilnd"]
                if any(t["health"] == "up" for t in kilnd):
                    return kilnd
                # Why it is down (e.g. "kilnd" not resolving), for wait_for's message.
                seen = "; ".join(f"{t['health']}: {t.get('lastError') or 'no error yet'}"
                                 for t in kilnd)
                raise RuntimeError(f"Prometheus's kilnd target: {seen or 'not listed'}")
            wait_for("the kilnd target up in Prometheus", target_up, 90, 1)

            def has_data():
                answer = json.loads(http(f"{api}/query?query=kiln_build_info")[1])
                return answer["data"]["result"]
            result = wait_for("kiln_build_info with data in Prometheus", has_data, 60, 1)
            log(f"Prometheus: target kilnd up, kiln_build_info = {result[0]['value'][1]} "
                f"{result[0]['metric']}")
        with step("compose down"):
            run(command + ["down", "--volumes", "--timeout", "45"], env=env, timeout=300)
    finally:
        service.terminate()
        service.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--prometheus-image", required=True)
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-container-test-")
    podman = Podman(f"kiln-ctest-{os.getpid()}")
    ok = False
    try:
        with step("the image against the Dockerfile, compose file and Kubernetes manifests"):
            check_image_contract(podman, args.image, args.root)
        volume = podman.create_volume("state")
        job, stopped = first_container(podman, args, volume, work)
        second_container(podman, args, volume, work, job, stopped)
        compose(podman, args, work)
        ok = True
    except StepFailed as error:
        print(f"container-test: {error}", file=sys.stderr)
    finally:
        if not ok:
            for cid in podman.containers:
                out, err = podman.logs(cid)
                print(f"--- logs of {cid[:12]} ---\n{out[-3000:]}{err[-6000:]}", file=sys.stderr)
        cleaned = podman.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok and cleaned else 1


if __name__ == "__main__":
    sys.exit(main())
