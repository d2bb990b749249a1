#!/usr/bin/env python3
"""Proves tests/deploy's checks fail when something they promise is missing: each case breaks
one thing in a temporary copy of the deployment files and expects the problem to be named.

Run: python3 tests/deploy/deploy_checks_test.py [-v]   (exit 77: PyYAML is not installed)
"""

import json
import os
import re
import shutil
import sys
import tempfile
import unittest

try:
    import yaml
except ImportError:
    print("skipped: PyYAML is not installed (apt-get install python3-yaml)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import deploy_checks  # noqa: E402
import validate_deploy  # noqa: E402

# What the checks read; copied into each case's temporary root.
COPIED = ["Dockerfile", "deploy", "server/main.cc"]


def text_edit(rel, pattern, replacement):
    """An edit replacing a regex (multiline) in one file; it must match."""
    def edit(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new, count = re.subn(pattern, replacement, old, flags=re.M)
        assert count, f"edit of {rel}: {pattern!r} matched nothing"
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return edit


def yaml_edit(rel, change):
    """An edit applying change(documents) to one YAML file."""
    def edit(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            docs = list(yaml.safe_load_all(f))
        change(docs)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
    return edit


def json_edit(rel, change):
    """An edit applying change(document) to one JSON file."""
    def edit(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        change(doc)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return edit


def remove_file(rel):
    return lambda root: os.remove(os.path.join(root, rel))


def kilnd_container(docs):
    return docs[0]["spec"]["template"]["spec"]["containers"][0]


def compose_service(name):
    return lambda docs: docs[0]["services"][name]


DEPLOYMENT = "deploy/k8s/deployment.yaml"
COMPOSE = "deploy/docker-compose.yml"
KUSTOMIZATION = "deploy/k8s/kustomization.yaml"
DASHBOARD = "deploy/grafana/dashboards/kiln.json"
WORKERS_JOB = "deploy/k8s/distributed/workers-job.yaml"
WORKERS_SERVICE = "deploy/k8s/distributed/workers-service.yaml"


def worker_container(docs):
    return docs[0]["spec"]["template"]["spec"]["containers"][0]


def drop_worker_env(name):
    def change(docs):
        c = worker_container(docs)
        c["env"] = [e for e in c["env"] if e["name"] != name]
    return change


def without(key):
    return lambda d: d.pop(key)


def panel(title):
    """The dashboard panel with this title."""
    def find(doc):
        return next(p for p in doc["panels"] if p.get("title") == title)
    return find


def set_target(title, **fields):
    return lambda d: panel(title)(d)["targets"][0].update(fields)


def strip_zero_fallback(doc):
    target = panel("Inference errors / s")(doc)["targets"][0]
    target["expr"] = target["expr"].split(" or on ")[0]


# (case, edits, expected problem text)
CASES = [
    # The distributed example (deploy/k8s/distributed)
    ("workers_not_indexed",
     [yaml_edit(WORKERS_JOB, lambda d: d[0]["spec"].pop("completionMode"))],
     "completionMode is not Indexed"),
    ("workers_token_not_secret",
     [yaml_edit(WORKERS_JOB, lambda d: next(
         e for e in worker_container(d)["env"] if e["name"] == "KILN_WORKER_TOKEN").update(
             {"value": "abc", "valueFrom": None}))],
     "KILN_WORKER_TOKEN does not come from a secret"),
    ("workers_no_gloo_host", [yaml_edit(WORKERS_JOB, drop_worker_env("KILN_GLOO_HOST"))],
     "peers would be told 127.0.0.1"),
    ("workers_no_gpu",
     [yaml_edit(WORKERS_JOB,
                lambda d: worker_container(d)["resources"]["limits"].pop("nvidia.com/gpu"))],
     "not one nvidia.com/gpu per worker"),
    ("workers_wrong_coordinator",
     [text_edit(WORKERS_JOB, r"value: kilnd:7070", "value: kiln-coordinator:7070")],
     "is not kilnd's Service"),
    ("workers_service_not_headless",
     [yaml_edit(WORKERS_SERVICE, lambda d: d[0]["spec"].pop("clusterIP"))],
     "no headless Service"),
    # Dockerfile
    ("dockerfile_one_stage", [text_edit("Dockerfile", r"^# ---- runtime bases(.|\n)*", "")],
     "KILN_DEVICE=cuda runs on"),
    ("dockerfile_no_user", [text_edit("Dockerfile", r"^USER .*$", "")], "runs as root"),
    ("dockerfile_user_root", [text_edit("Dockerfile", r"^USER .*$", "USER root")], "runs as root"),
    ("dockerfile_user_by_name", [text_edit("Dockerfile", r"^USER .*$", "USER kiln")],
     "is not numeric"),
    ("dockerfile_no_volume", [text_edit("Dockerfile", r"^VOLUME .*$", "")], "is on no VOLUME"),
    ("dockerfile_no_metrics_port", [text_edit("Dockerfile", r"^EXPOSE .*$", "EXPOSE 7070")],
     "port 9464 is not EXPOSEd"),
    ("dockerfile_no_healthcheck", [text_edit("Dockerfile", r"^HEALTHCHECK .*\\\n.*\n", "")],
     "no HEALTHCHECK"),
    ("dockerfile_no_entrypoint", [text_edit("Dockerfile", r"^ENTRYPOINT .*$", "")],
     "no ENTRYPOINT"),
    ("dockerfile_no_install_deps",
     [text_edit("Dockerfile", r"^RUN scripts/install-deps --image$", "RUN true")],
     "does not RUN scripts/install-deps --image"),
    ("dockerfile_no_scripts_build", [text_edit("Dockerfile", r"^RUN scripts/build", "RUN make")],
     "no stage RUNs scripts/build"),
    ("dockerfile_no_cpu_variant",
     [text_edit("Dockerfile", r"^FROM debian:12 AS build-cpu",
                "FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu24.04 AS build-cpu")],
     "KILN_DEVICE=cpu builds on"),
    ("dockerfile_cuda_on_cpu", [text_edit("Dockerfile", r"KILN_CUDA=OFF", "KILN_CUDA=ON")],
     "KILN_DEVICE=cpu builds with KILN_CUDA='ON'"),
    ("dockerfile_copies_build_tree",
     [text_edit("Dockerfile", r"^COPY --from=binaries /kilnd .*$",
                "COPY --from=build /src/build /opt/kiln")],
     "copies a whole tree (/src/build)"),
    ("dockerfile_listens_on_loopback",
     [text_edit("Dockerfile", r"FLAGS_listen=0\.0\.0\.0:", "FLAGS_listen=127.0.0.1:")],
     "FLAGS_listen does not bind 0.0.0.0"),
    ("dockerfile_flag_typo", [text_edit("Dockerfile", r"FLAGS_data_dir=", "FLAGS_datadir=")],
     "FLAGS_datadir names no kilnd flag"),
    ("entrypoint_does_not_run_kilnd",
     [text_edit("deploy/image/kilnd-entrypoint", r"^exec kilnd", "exec sleep")],
     "does not exec kilnd"),
    # docker-compose
    ("compose_no_gpu_reservation", [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd"]
                                              .pop("deploy"))],
     "no kilnd service reserves a GPU"),
    ("compose_no_cpu_profile",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd-cpu"].update(profiles=["small"]))],
     'no kilnd service in a "cpu" profile'),
    ("compose_gpu_without_profile",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd"].pop("profiles"))],
     "kilnd has no profile"),
    ("compose_no_default_profile", [remove_file("deploy/.env")],
     "does not start kilnd by default"),
    ("compose_cpu_not_reachable_as_kilnd",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd-cpu"].pop("networks"))],
     "not kilnd-cpu at port 9464"),
    ("compose_no_prometheus_config",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["prometheus"].update(volumes=[]))],
     "prometheus mounts no /etc/prometheus/prometheus.yml"),
    ("compose_no_dashboards",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["grafana"]["volumes"].remove(
         "./grafana/dashboards:/var/lib/grafana/dashboards:ro"))],
     "grafana does not mount ./grafana/dashboards"),
    ("compose_no_state_volume",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd"].pop("volumes"))],
     "kilnd mounts nothing at the image's VOLUME /var/lib/kiln"),
    # Kubernetes
    ("k8s_no_gpu_limit",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d)["resources"]["limits"]
                .pop("nvidia.com/gpu"))],
     "no nvidia.com/gpu limit"),
    ("k8s_liveness_not_grpc",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d).update(
         livenessProbe={"tcpSocket": {"port": 7070}}))],
     "livenessProbe is not a native gRPC probe"),
    ("k8s_readiness_wrong_port",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d)["readinessProbe"]["grpc"].update(
         port=8080))],
     "readinessProbe probes port 8080"),
    ("k8s_readiness_unknown_service",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d)["readinessProbe"]["grpc"].update(
         service="kiln.Training"))],
     "which kilnd's health service does not know"),
    ("k8s_may_run_as_root",
     [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"]["template"]["spec"]["securityContext"]
                .pop("runAsNonRoot"))],
     "runAsNonRoot is not true"),
    ("k8s_writable_root",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d)["securityContext"].update(
         readOnlyRootFilesystem=False))],
     "readOnlyRootFilesystem is not true"),
    ("k8s_no_tmp_volume",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d).update(volumeMounts=[
         m for m in kilnd_container(d)["volumeMounts"] if m["mountPath"] != "/tmp"]))],
     "the tmp dir /tmp is on no writable volume"),
    ("k8s_state_not_on_claim",
     [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"]["template"]["spec"]["volumes"][0].update(
         persistentVolumeClaim={"claimName": "other"}))],
     "the state dir is not on a PersistentVolumeClaim"),
    ("k8s_no_pvc",
     [yaml_edit(KUSTOMIZATION, lambda d: d[0]["resources"].remove("persistentvolumeclaim.yaml")),
      remove_file("deploy/k8s/persistentvolumeclaim.yaml")],
     "no PersistentVolumeClaim among the resources"),
    ("k8s_file_not_in_kustomization",
     [yaml_edit(KUSTOMIZATION, lambda d: d[0]["resources"].remove("service.yaml"))],
     "service.yaml is not in resources"),
    ("k8s_service_port_mismatch",
     [yaml_edit("deploy/k8s/service.yaml", lambda d: d[0]["spec"]["ports"][1].update(
         targetPort=8080))],
     "port metrics targets 8080"),
    ("k8s_no_servicemonitor",
     [yaml_edit(KUSTOMIZATION, lambda d: d[0]["resources"].remove("servicemonitor.yaml")),
      remove_file("deploy/k8s/servicemonitor.yaml")],
     "no ServiceMonitor among the resources"),
    # Grafana
    ("grafana_fixed_datasource_uid",
     [json_edit(DASHBOARD, set_target("Samples / s", datasource={"type": "prometheus",
                                                                  "uid": "kiln-prometheus"}))],
     "names data source 'kiln-prometheus', a fixed one"),
    ("grafana_fixed_panel_datasource",
     [json_edit(DASHBOARD, lambda d: panel("Learning rate")(d).update(datasource="Prometheus"))],
     "names data source 'Prometheus', a fixed one"),
    ("grafana_no_datasource_variable",
     [json_edit(DASHBOARD, lambda d: d["templating"]["list"].pop(0))],
     "no data source variable"),
    ("grafana_error_panel_no_data", [json_edit(DASHBOARD, strip_zero_fallback)],
     "shows no data rather than 0 while there are no errors"),
    ("grafana_job_label_filter",
     [json_edit(DASHBOARD, set_target("Learning rate",
                                      expr='kiln_training_learning_rate{job=~"$job_id"}'))],
     "the per-job label is job_id"),
    ("grafana_job_label_grouping",
     [json_edit(DASHBOARD, set_target("Checkpoints",
                                      expr="sum by (job, kind) (kiln_checkpoints_total)"))],
     "groups by `job`"),
    ("grafana_job_variable",
     [json_edit(DASHBOARD, lambda d: d["templating"]["list"][1].update(
         definition="label_values(kiln_training_step, job)"))],
     "variable job_id lists `job` values"),
    ("k8s_configmap_not_referenced",
     [yaml_edit(DEPLOYMENT, lambda d: kilnd_container(d).pop("envFrom"))],
     "envFrom references none of the ConfigMaps"),
    ("k8s_configmap_port_mismatch",
     [yaml_edit("deploy/k8s/configmap.yaml", lambda d: d[0]["data"].update(
         FLAGS_listen="0.0.0.0:8000"))],
     "FLAGS_listen=0.0.0.0:8000 does not bind 0.0.0.0 on the container's port 7070"),
    ("k8s_configmap_flag_typo",
     [yaml_edit("deploy/k8s/configmap.yaml", lambda d: d[0]["data"].update(FLAGS_lisen="x"))],
     "FLAGS_lisen names no kilnd flag"),
    ("k8s_flag_gone_from_kilnd",
     [text_edit("server/main.cc", r"^ABSL_FLAG\(std::string, log_format,", "// gone:")],
     "FLAGS_log_format names no kilnd flag"),
    ("k8s_rolling_update",
     [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"].update(strategy={"type": "RollingUpdate"}))],
     "strategy is not Recreate"),
    ("compose_scrape_host_refused",
     [yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd-cpu"]["environment"].pop(
         "FLAGS_http_allowed_hosts"))],
     "kilnd-cpu does not allow Host kilnd (FLAGS_http_allowed_hosts)"),
    ("k8s_user_not_the_images",
     [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"]["template"]["spec"]["securityContext"].update(
         runAsUser=1000))],
     "runAsUser 1000 is not the image's (USER 10001:10001)"),
    ("k8s_two_replicas", [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"].update(replicas=2))],
     "replicas is 2, not 1"),
    ("k8s_grace_shorter_than_shutdown",
     [yaml_edit(DEPLOYMENT, lambda d: d[0]["spec"]["template"]["spec"].update(
         terminationGracePeriodSeconds=20))],
     "terminationGracePeriodSeconds 20 is not longer than"),
]


def inspect_of(contract, **config):
    """`podman image inspect` of an image built as the Dockerfile says, with `config` over it."""
    record = {
        "Env": [f"{k}={v}" for k, v in contract.env.items()] + ["PATH=/usr/local/bin:/usr/bin"],
        "ExposedPorts": {f"{p}/tcp": {} for p in contract.ports},
        "Volumes": {v: {} for v in contract.volumes},
        "User": contract.user,
        "Healthcheck": {"Test": ["CMD-SHELL", "kiln --server 127.0.0.1:7070 health || exit 1"]},
        "Entrypoint": ["kilnd-entrypoint"],
    }
    record.update(config)
    return {"Config": record}


def make_root(edits=()):
    """A temporary root holding copies of COPIED, with the edits applied."""
    root = tempfile.mkdtemp(prefix="kiln-deploy-check-")
    for rel in COPIED:
        source, target = os.path.join(ROOT, rel), os.path.join(root, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, target)
    for edit in edits:
        edit(root)
    return root


class DeployChecksCatchBreakage(unittest.TestCase):
    def setUp(self):
        self.roots = []

    def tearDown(self):
        for root in self.roots:
            shutil.rmtree(root, ignore_errors=True)

    def root(self, edits=()):
        self.roots.append(make_root(edits))
        return self.roots[-1]

    def test_unbroken_copy_passes(self):
        self.assertEqual(deploy_checks.check_all(self.root()), [])

    def test_each_breakage_is_named(self):
        for case, edits, expected in CASES:
            with self.subTest(case=case):
                problems = deploy_checks.check_all(self.root(edits))
                self.assertTrue(any(expected in p for p in problems),
                                f"{case}: expected a problem containing {expected!r}, "
                                f"got {problems}")

    def test_built_image_disagreements_are_named(self):
        root = self.root()
        contract = deploy_checks.image_contract(root)
        self.assertEqual(deploy_checks.check_built_image(root, inspect_of(contract)), [])
        env = [e for e in inspect_of(contract)["Config"]["Env"] if "FLAGS_state_dir" not in e]
        for case, config, expected in (
                ("root user", {"User": "0:0"}, "user '0:0', the Dockerfile says '10001:10001'"),
                ("OCI format", {"Healthcheck": None}, "no health check running"),
                ("a port lost", {"ExposedPorts": {"7070/tcp": {}}}, "ports {7070}"),
                ("flag lost", {"Env": env}, "FLAGS_state_dir=None"),
                ("entrypoint", {"Entrypoint": ["kilnd"]}, "not kilnd-entrypoint")):
            with self.subTest(case=case):
                problems = deploy_checks.check_built_image(root, inspect_of(contract, **config))
                self.assertTrue(any(expected in p for p in problems), f"{case}: {problems}")

    def test_yamllint_rejects_a_duplicate_key(self):
        if shutil.which("yamllint") is None:
            self.skipTest("yamllint is not installed")
        root = self.root([text_edit(DEPLOYMENT, r"^  replicas: 1$",
                                    "  replicas: 1\n  replicas: 1")])
        self.assertEqual(validate_deploy.lint(root), 1)

    def test_docker_compose_rejects_an_unknown_key(self):
        if shutil.which("docker-compose") is None:
            self.skipTest("docker-compose is not installed")
        root = self.root([yaml_edit(COMPOSE, lambda d: d[0]["services"]["kilnd"].update(
            gpus_please=True))])
        self.assertEqual(validate_deploy.compose(root), 1)


if __name__ == "__main__":
    unittest.main()
