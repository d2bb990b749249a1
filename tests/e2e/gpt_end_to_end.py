#!/usr/bin/python3
"""End to end through kilnd: a character-level GPT as a user trains and serves it (issue 36).

  tests/e2e/gpt_end_to_end.py KILND KILN

Writes a small text corpus here, starts KILND on temporary folders, uploads it with
`kiln upload NAME --format text`, trains examples/char-gpt.json (nanoGPT's small model) for a few
hundred iterations with `kiln submit --watch --output json`, and checks that the validation loss
streamed at every interval falls well below an untrained model's ln(vocabulary). Then exports the
checkpoint, which must carry the corpus's vocabulary, and, where later steps of the issue exist,
deploys it and asks it for text.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

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


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kilnd, kiln_bin = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="kiln-gpt-e2e-")
    corpus = os.path.join(tmp, "corpus.txt")
    text = make_corpus(corpus, random.Random(36))
    vocab = len(set(text))
    try:
        proc, addr = start_kilnd(kilnd, tmp)
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
    finally:
        proc.terminate()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
