#!/usr/bin/python3
"""End to end through kilnd: a character-level GPT as a user trains and serves it (issue 36).

  tests/e2e/gpt_end_to_end.py KILND KILN

Writes a small text corpus here, starts KILND on temporary folders, uploads it with
`kiln upload NAME --format text`, trains examples/char-gpt.json (nanoGPT's small model) for a few
hundred iterations with `kiln submit --watch --output json`, and checks that the validation loss
streamed at every interval falls well below an untrained model's ln(vocabulary). Then exports the
checkpoint, which must carry the corpus's vocabulary and the tied table once, deploys it, and
asks it for text over REST (generate, generate_stream) and gRPC (`kiln generate`): the same seed
gives the same text everywhere. Where /usr/bin/python3 has torch, the checkpoint is loaded into
the PyTorch peer's GPT module with strict=True (tests/engine/gpt_torch_check.py) and its
last-position logits for a prompt must be what KServe v2 infer answers for the same ids.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from kilnd_child import start_kilnd  # noqa: E402

SPEC = os.path.join(ROOT, "examples", "char-gpt.json")


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def make_corpus(path, rng, chars=60000):
    """Sentences from a small grammar: structure a few hundred iterations learn much of."""
    subjects = ["the cat", "a dog", "my aunt", "the old sailor", "every child", "Zoë"]
    verbs = ["sees", "likes", "paints", "follows", "finds", "hears"]
    objects = ["the sea", "a red kite", "the moon", "two apples", "the garden", "a song"]
    out = []
    size = 0
    while size < chars:
        s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}."
        s = s[0].upper() + s[1:] + ("\n" if rng.random() < 0.2 else " ")
        out.append(s)
        size += len(s)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))
    return "".join(out)


def http_port(tmp):
    with open(os.path.join(tmp, "kilnd.out")) as f:
        for line in f:
            if "metrics on port" in line:
                return int(line.rsplit(" ", 1)[1])
    fail("kilnd did not say its HTTP port")


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode()


def serve_and_compare(kiln, port, ckpt, chars):
    """Text from the deployed model over REST and gRPC, and its logits against PyTorch's."""
    params = {"max_tokens": 40, "temperature": 0.8, "top_k": 10, "seed": 7}
    prompt = "The cat"
    text = json.loads(post(port, "/v2/models/chars/generate",
                           {"text_input": prompt, "parameters": params}))["text_output"]
    if len(text) != 40 or any(c not in chars for c in text):
        fail(f"generate gave {text!r}: not 40 characters of the vocabulary")
    stream = post(port, "/v2/models/chars/generate_stream",
                  {"text_input": prompt, "parameters": params})
    events = [json.loads(line[len("data: "):]) for line in stream.splitlines()
              if line.startswith("data: ")]
    if "".join(e["text_output"] for e in events) != text or len(events) != 40:
        fail(f"generate_stream's {len(events)} events do not join into generate's text")
    grpc = json.loads(kiln("generate", "chars", prompt, "--max-tokens", "40", "--temperature",
                           "0.8", "--top-k", "10", "--seed", "7", "--output", "json").stdout)
    if grpc.get("text_output") != text:
        fail(f"kiln generate (gRPC) gave {grpc!r}, REST {text!r}")
    print(f"generated (REST, stream, gRPC alike): {prompt!r} -> {text!r}", flush=True)

    ids = [chars.index(c) for c in prompt]
    infer = json.loads(post(port, "/v2/models/chars/infer", {"inputs": [
        {"name": "input", "datatype": "INT64", "shape": [1, len(ids)], "data": ids}]}))
    served = infer["outputs"][0]["data"]
    try:
        import torch
    except ImportError:
        print("SKIP (torch part): /usr/bin/python3 cannot import torch", flush=True)
        return
    sys.path.insert(0, os.path.join(ROOT, "tests", "engine"))
    from gpt_torch_check import load_kiln_gpt, logits_of
    model, cfg = load_kiln_gpt(ckpt)
    with torch.no_grad():
        logits = logits_of(model, torch.tensor([ids]))[0, -1].tolist()
    worst = max(abs(a - b) for a, b in zip(logits, served))
    print(f"torch (strict=True, {cfg['checkpoint_parameters']} parameters) and KServe infer: "
          f"last-position logits within {worst:.2e}", flush=True)
    if len(logits) != len(served) or worst > 1e-3:
        fail(f"torch's logits and the served model's differ by {worst}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kilnd, kiln_bin = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="kiln-gpt-e2e-")
    corpus = os.path.join(tmp, "corpus.txt")
    text = make_corpus(corpus, random.Random(36))
    vocab = len(set(text))
    try:
        proc, addr = start_kilnd(kilnd, tmp, "--metrics_listen", "127.0.0.1:0")
    except RuntimeError as e:
        fail(str(e))
    env = dict(os.environ, KILN_SERVER=addr)

    def kiln(*args, ok=True):
        out = subprocess.run([kiln_bin, *args], env=env, capture_output=True, text=True)
        if ok and out.returncode != 0:
            fail(f"kiln {' '.join(args)} exited {out.returncode}:\n{out.stderr}")
        return out

    try:
        kiln("upload", "chars", "--format", "text", corpus)
        listed = json.loads(kiln("datasets", "--output", "json").stdout)
        print(f"uploaded: {json.dumps(listed)[:300]}", flush=True)

        events = kiln("submit", SPEC, "--dataset", "chars", "--max-iters", "300",
                      "--eval-interval", "100", "--watch", "--output", "json").stdout
        job, val = None, []
        for line in events.splitlines():
            e = json.loads(line)
            job = job or e.get("id")
            if isinstance(e.get("epoch"), dict) and e["epoch"].get("test_samples"):
                val.append(e["epoch"]["test_loss"])
        if job is None or len(val) != 3:
            fail(f"expected a job and 3 validation losses in kiln's stream:\n{events[:3000]}")
        print(f"job {job}: validation loss at 100, 200, 300 iterations: "
              f"{', '.join(f'{v:.3f}' for v in val)} (ln vocab {math.log(vocab):.3f})", flush=True)
        if not val[-1] < val[0] or val[-1] > math.log(vocab) - 1.0:
            fail(f"the validation loss did not fall far enough: {val}")
        shown = kiln("get", job).stdout
        if "val ppl" not in shown:
            fail(f"kiln get shows no perplexity for a language model:\n{shown}")

        ckpt = os.path.join(tmp, "gpt.safetensors")
        kiln("export", job, "-o", ckpt)
        with open(ckpt, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        chars = json.loads(header["__metadata__"]["kiln.vocabulary"])
        if "".join(chars) != "".join(sorted(set(text))):
            fail("the checkpoint's vocabulary is not the corpus's sorted characters")
        if "lm_head.weight" in header or "wte.weight" not in header:
            fail("a tied lm_head must be saved once, as wte.weight")

        kiln("deploy", job, "--name", "chars")
        serve_and_compare(kiln, http_port(tmp), ckpt, chars)
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
