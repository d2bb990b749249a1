#!/usr/bin/env python3
"""Validates kiln's container and deployment files without a Docker engine or a cluster.

Usage: validate_deploy.py lint|compose|structure ROOT
  lint       yamllint --strict with deploy/.yamllint on every YAML file under deploy/
  compose    docker-compose's own validation of deploy/docker-compose.yml (config -q)
  structure  deploy_checks.py: the Dockerfile, compose file, Kubernetes manifests and Grafana
             dashboards have what they must (stages, USER, probes, GPU limit, ports, volumes,
             a data source variable, error panels that show 0, ...)
Exit status: 0 passed, 1 failed, 77 skipped because the tool it needs is not installed.
"""

import os
import shutil
import subprocess
import sys

SKIPPED = 77


def skip(reason):
    print(f"skipped: {reason}")
    return SKIPPED


def run(command, root):
    print("+ " + " ".join(command), flush=True)
    # The caller's COMPOSE_* settings (COMPOSE_FILE, COMPOSE_PROFILES) must not change the check.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    return 0 if subprocess.run(command, cwd=root, env=env).returncode == 0 else 1


def lint(root):
    if shutil.which("yamllint") is None:
        return skip("yamllint is not installed (apt-get install yamllint)")
    return run(["yamllint", "--strict", "-c", "deploy/.yamllint", "deploy"], root)


def compose(root):
    if shutil.which("docker-compose") is None:
        return skip("docker-compose is not installed (apt-get install docker-compose)")
    return run(["docker-compose", "-f", "deploy/docker-compose.yml", "config", "-q"], root)


def structure(root):
    try:
        import deploy_checks  # needs PyYAML
    except ImportError as e:
        return skip(f"{e} (apt-get install python3-yaml)")
    problems = deploy_checks.check_all(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)" if problems else "structure: all checks passed")
    return 1 if problems else 0


CHECKS = {"lint": lint, "compose": compose, "structure": structure}


def main(argv):
    if len(argv) != 3 or argv[1] not in CHECKS or not os.path.isdir(argv[2]):
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return CHECKS[argv[1]](os.path.abspath(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
