#!/usr/bin/python3
"""kilnd's web page in a real browser (Debian's chromium, headless, driven by puppeteer-core).

  tests/e2e/web_page_browser.py KILND KILN ARTEFACTS_DIR

Starts KILND with bearer tokens on (--auth_tokens_file) and its HTTP port, makes a small IDX
dataset (28x28 images whose label is where a bright block sits) and uploads it with KILN, and
calls every /api route without a token, which must be refused (401). Then it runs
tests/e2e/web_page_browser.js, which opens the page and gives the token at its prompt; once the
page shows its empty jobs table, this submits a job that trains for several seconds
(--step_delay) and a short second one (a plain mnist-cnn preset of one epoch). The browser half checks that the table shows them and
follows them, that the loss curve draws with live points arriving while the job runs,
Checkpoint now, Resume and a checkpoint's download from the job's page, that the preset job's
page shows the optimizer and batch size kilnd resolved from its preset, that its one-epoch
accuracy chart draws its point and that its learning-rate ticks read differently, that two jobs
compare on
one chart, that a deployed checkpoint classifies an image dropped on the Models page (the class
the page shows must be the one kilnd's REST inference answers for the same pixels), and
Undeploy. No JavaScript error may occur.

Screenshots (1280x800 and 400 px wide) go to ARTEFACTS_DIR. Exits 77 (skipped) where chromium or
puppeteer-core is missing (scripts/install-deps installs both); KILN_CHROMIUM names another
chromium binary.
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from kilnd_child import start_kilnd  # noqa: E402

DRIVER = os.path.join(ROOT, "tests", "e2e", "web_page_browser.js")
TOKEN = "web-page-test-token-7f3a"
SIDE = 28


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def skip(message):
    print("SKIP: " + message, flush=True)
    sys.exit(77)


def toy_image(rng, label):
    """A bright 7x7 block in cell (label // 4, label % 4) of a 4x4 grid, over faint noise."""
    pixels = bytearray(rng.randrange(40) for _ in range(SIDE * SIDE))
    y0, x0 = 7 * (label // 4), 7 * (label % 4)
    for y in range(y0, y0 + 7):
        for x in range(x0, x0 + 7):
            pixels[y * SIDE + x] = 200 + rng.randrange(56)
    return bytes(pixels)


def write_idx(folder, prefix, n, rng):
    labels = [rng.randrange(10) for _ in range(n)]
    images = b"".join(toy_image(rng, k) for k in labels)
    with open(os.path.join(folder, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, SIDE, SIDE) + images)
    with open(os.path.join(folder, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))


def write_png(path, pixels):
    """An 8-bit grayscale PNG of SIDE x SIDE pixels."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    rows = b"".join(b"\x00" + pixels[y * SIDE:(y + 1) * SIDE] for y in range(SIDE))
    header = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 0, 0, 0, 0)  # 8-bit gray, no interlace
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def http(base, method, path, token=None, body=None):
    """(status, parsed JSON body or None)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            status, text = res.status, res.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, None


def main():
    if len(sys.argv) != 4:
        fail("usage: web_page_browser.py KILND KILN ARTEFACTS_DIR")
    kilnd, kiln, artefacts = sys.argv[1:]
    chromium = os.environ.get("KILN_CHROMIUM") or shutil.which("chromium")
    node = shutil.which("node")
    if not chromium or not node:
        skip("needs Debian's chromium and node (scripts/install-deps)")
    npm_root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, NODE_PATH=npm_root, KILN_CHROMIUM=chromium)
    if subprocess.run([node, "-e", "require('puppeteer-core')"], env=env,
                      capture_output=True).returncode != 0:
        skip("needs puppeteer-core from npm (scripts/install-deps)")
    os.makedirs(artefacts, exist_ok=True)
    for name in os.listdir(artefacts):  # a failed run's pictures must not pass for this run's
        if name.endswith(".png"):
            os.remove(os.path.join(artefacts, name))

    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="kiln-web-")
    proc = None
    try:
        data = os.path.join(work, "toy")
        os.makedirs(data)
        write_idx(data, "train", 2048, rng)
        write_idx(data, "test", 256, rng)
        label = 6
        pixels = toy_image(rng, label)
        png = os.path.join(work, "six.png")
        write_png(png, pixels)
        with open(os.path.join(work, "six.raw"), "wb") as f:
            f.write(pixels)
        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            f.write(TOKEN + "\n")
        proc, address = start_kilnd(kilnd, os.path.join(work, "kilnd"), "--metrics_listen",
                                    "127.0.0.1:0", "--auth_tokens_file", tokens,
                                    "--step_delay", "40ms")
        out = open(os.path.join(work, "kilnd", "kilnd.out")).read()
        port = [line.rsplit(" ", 1)[1] for line in out.splitlines() if "metrics on port" in line]
        if not port:
            fail("kilnd did not say its HTTP port:\n" + out)
        base = "http://127.0.0.1:" + port[0]

        def run_kiln(*args):
            r = subprocess.run([kiln, "--server", address, "--token", TOKEN, *args],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                fail(f"kiln {' '.join(args)}: {r.stdout}{r.stderr}")
            return r.stdout

        run_kiln("upload", "toy", "--train-images", os.path.join(data, "train-images-idx3-ubyte"),
                 "--train-labels", os.path.join(data, "train-labels-idx1-ubyte"),
                 "--test-images", os.path.join(data, "test-images-idx3-ubyte"),
                 "--test-labels", os.path.join(data, "test-labels-idx1-ubyte"))
        # Every /api call without a token (and with a wrong one) is refused.
        job = "job-0"
        api_calls = [("GET", "/api/jobs"), ("GET", f"/api/jobs/{job}"),
                     ("GET", f"/api/jobs/{job}/checkpoints"),
                     ("GET", f"/api/jobs/{job}/checkpoints/1/file"),
                     ("GET", f"/api/jobs/{job}/events"), ("GET", "/api/events"),
                     ("GET", "/api/models"), ("POST", f"/api/jobs/{job}/cancel"),
                     ("POST", f"/api/jobs/{job}/resume"), ("POST", f"/api/jobs/{job}/checkpoint")]
        for method, path in api_calls:
            for token in (None, "not-" + TOKEN):
                status, body = http(base, method, path, token)
                if status != 401 or not body or "token" not in body.get("error", ""):
                    fail(f"{method} {path} with token {token!r}: {status} {body}, not 401")
        status, _ = http(base, "GET", "/")
        if status != 200:
            fail(f"GET / answered {status}")

        # The jobs are submitted once the page is open, so that it sees them arrive and train
        # however long the browser took to start.
        browser = subprocess.Popen([node, DRIVER, base, TOKEN, png, artefacts], env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first_line = browser.stdout.readline()
        if first_line.strip() != "ready":
            browser.kill()
            fail("the browser half did not get the page open: " + first_line)
        # 64 steps an epoch at 40 ms or more each: the first job trains for several seconds.
        job = json.loads(run_kiln("--output", "json", "submit", "--preset", "mnist-mlp",
                                  "--dataset", "toy", "--epochs", "4", "--batch-size", "32",
                                  "--lr", "0.05", "--name", "web-test"))["id"]
        # A plain preset of one epoch: the page shows the recipe kilnd resolved for it, and the
        # accuracy chart's one point.
        second = json.loads(run_kiln("--output", "json", "submit", "--preset", "mnist-cnn",
                                     "--dataset", "toy", "--epochs", "1",
                                     "--name", "web-test-2"))["id"]

        browser.stdin.write(f"{job} {second}\n")
        browser.stdin.flush()
        try:
            rest, _ = browser.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            browser.kill()
            fail("the browser half did not finish within 180 s")
        print(rest, flush=True)
        if browser.returncode != 0:
            fail("the browser checks failed (above)")
        result = json.loads(rest.strip().splitlines()[-1])

        # The browser half compared the page's class with kilnd's REST answer for the pixels.
        if result.get("expected") is None or not result["classified"].startswith(
                f"class {result['expected']} "):
            fail(f"the page's class {result.get('classified')!r} was not checked against kilnd's")
        print(f"ok: live points {result['live_points']}, classified {result['classified']} "
              f"(trained label {label})")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                fail("kilnd did not stop within 30 s of SIGTERM with the page's streams open")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
