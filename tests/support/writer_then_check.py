#!/usr/bin/python3
"""Runs an interop check as ctest does: a gtest writer, then an independent Python check.

  writer_then_check.py --requires numpy,torch --env KILN_X_DIR --gtest BIN --filter 'Suite.*' \
      [--before 'CMD {dir}'] --check 'CMD {dir}'

Makes a temporary DIR; runs --before (if any), then BIN with the environment variable --env set
to DIR and --filter (the writer must run, not skip: a skipped writer is a failure here), then
--check; {dir} in the commands becomes DIR. Exits 77 (ctest's skip) when /usr/bin/python3 lacks
a module of --requires, otherwise with the first failing step's code.
"""
import argparse
import importlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def run(command, directory, env=None):
    argv = [part.replace("{dir}", directory) for part in shlex.split(command)]
    if argv[0].endswith(".py"):
        argv.insert(0, sys.executable)
    print("+ " + " ".join(shlex.quote(a) for a in argv), flush=True)
    return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requires", default="")
    parser.add_argument("--env", required=True)
    parser.add_argument("--gtest", required=True)
    parser.add_argument("--filter", required=True)
    parser.add_argument("--before")
    parser.add_argument("--check", required=True)
    args = parser.parse_args()
    for module in filter(None, args.requires.split(",")):
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"SKIP: {sys.executable} has no {module} (Debian: python3-{module})")
            sys.exit(77)
    directory = tempfile.mkdtemp(prefix="kiln_interop_")
    try:
        steps = []
        if args.before:
            steps.append((args.before, None))
        env = dict(os.environ, **{args.env: directory})
        steps.append((shlex.quote(args.gtest) + " --gtest_filter=" + shlex.quote(args.filter),
                      env))
        steps.append((args.check, None))
        for command, step_env in steps:
            result = run(command, directory, step_env)
            print(result.stdout, end="", flush=True)
            if result.returncode != 0:
                sys.exit(result.returncode)
            if step_env is not None and ("[  SKIPPED ]" in result.stdout or
                                         "[  PASSED  ] 0 tests" in result.stdout):
                print(f"FAIL: the writer {args.filter} did not run")
                sys.exit(1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
