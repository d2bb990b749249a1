"""Structural checks of kiln's container and deployment files against what they must provide.

Each check_* function takes the repository root and returns a list of problems, each naming the
file and what is missing or inconsistent; an empty list means the files have everything checked.
Nothing here builds an image, starts a container or talks to a cluster.
"""

import collections
import json
import os
import re

import yaml

import dockerfile_parser

DOCKERFILE = "Dockerfile"
COMPOSE = "deploy/docker-compose.yml"
COMPOSE_ENV = "deploy/.env"
K8S = "deploy/k8s"
K8S_DISTRIBUTED = "deploy/k8s/distributed"
PROMETHEUS_CONFIG = "deploy/prometheus/prometheus.yml"
GRAFANA_DASHBOARDS = "deploy/grafana/dashboards"
GRPC_HEALTH_SERVICES = ("", "kiln.v1.Training")  # the names kilnd's grpc.health.v1 answers for
DEFAULT_SHUTDOWN_TIMEOUT_S = 30  # kilnd's --shutdown_timeout default (server/main.cc)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def load_yaml(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kilnd_flags(root):
    """The names of the flags server/main.cc defines."""
    return set(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", read(root, "server/main.cc")))


def unknown_flag_vars(where, env, flags):
    """Problems for FLAGS_<name> variables whose name is not a kilnd flag."""
    return [f"{where}: {key} names no kilnd flag (server/main.cc)"
            for key in sorted(env) if key.startswith("FLAGS_") and key[len("FLAGS_"):] not in flags]


def host_port(address):
    """("0.0.0.0", 7070) from "0.0.0.0:7070"; (address, None) when there is no numeric port."""
    host, _, port = str(address).rpartition(":")
    return (host, int(port)) if port.isdigit() else (str(address), None)


def seconds(duration):
    """Seconds in an absl duration such as "30s", "2m" or "1m30s"; None when unreadable."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", str(duration))
    if not parts or "".join(n + u for n, u in parts) != str(duration):
        return None
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def under(path, directory):
    directory = directory.rstrip("/")
    return path == directory or path.startswith(directory + "/")


# ---------------------------------------------------------------------------------------------
# Dockerfile


# What an image promises the files that run it: its environment, exposed ports, volumes and user
# (as USER writes it, "10001:10001").
ImageContract = collections.namedtuple("ImageContract", "env ports volumes user")


def image_contract(root):
    """What the Dockerfile's final stage promises."""
    _, stages = dockerfile_parser.parse(read(root, DOCKERFILE))
    final = stages[-1] if stages else dockerfile_parser.Stage("", None)
    ports = {int(p.split("/")[0]) for args in final.all("EXPOSE") for p in args.split()}
    volumes = set()
    for args in final.all("VOLUME"):
        args = args.strip()
        volumes.update(yaml.safe_load(args) if args.startswith("[") else args.split())
    users = final.all("USER")
    return ImageContract(final.env(), ports, volumes, users[-1].strip() if users else "")


def built_image_contract(inspect):
    """What a built image promises, from `podman image inspect` (or docker's)."""
    config = inspect.get("Config") or {}
    env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
    ports = {int(p.split("/")[0]) for p in config.get("ExposedPorts") or {}}
    return ImageContract(env, ports, set(config.get("Volumes") or {}), config.get("User") or "")


def check_built_image(root, inspect):
    """A built image against the Dockerfile it came from and the compose file and Kubernetes
    manifests that run it: what the build really made, not what the Dockerfile's text says."""
    where = "the built image"
    problems = []
    built, written = built_image_contract(inspect), image_contract(root)
    for key, value in written.env.items():
        if built.env.get(key) != value:
            problems.append(f"{where}: {key}={built.env.get(key)!r}, the Dockerfile says {value!r}")
    for field in ("ports", "volumes", "user"):
        if getattr(built, field) != getattr(written, field):
            problems.append(f"{where}: {field} {getattr(built, field)!r}, the Dockerfile says "
                            f"{getattr(written, field)!r}")
    config = inspect.get("Config") or {}
    # Docker keeps the health check in Config, podman beside it.
    healthcheck = config.get("Healthcheck") or inspect.get("Healthcheck") or {}
    test = " ".join(healthcheck.get("Test") or [])
    if not re.search(r"\bkiln\b.*\bhealth\b", test):
        problems.append(f"{where}: no health check running `kiln ... health` (built in OCI "
                        f"format? HEALTHCHECK needs --format docker): {test!r}")
    if [os.path.basename(w) for w in config.get("Entrypoint") or []] != ["kilnd-entrypoint"]:
        problems.append(f"{where}: entrypoint {config.get('Entrypoint')}, not kilnd-entrypoint")
    return problems + check_compose(root, built) + check_kubernetes(root, built)


def check_dockerfile(root):
    problems = []
    where = DOCKERFILE
    global_args, stages = dockerfile_parser.parse(read(root, DOCKERFILE))
    by_name = {s.name: s for s in stages if s.name}
    if len(stages) < 2:
        return [f"{where}: not multi-stage (a build stage and a runtime stage)"]

    # The global ARG KILN_DEVICE picks the variant; resolve() follows FROM <name>-${KILN_DEVICE}
    # to the base image each device gets.
    if "KILN_DEVICE" not in global_args:
        problems.append(f"{where}: no global ARG KILN_DEVICE (cuda|cpu) choosing the variant")

    def resolve(stage, device):
        """The stage a FROM of `stage` reaches for the device, following FROM <stage> chains."""
        seen = set()
        while stage is not None and id(stage) not in seen:
            seen.add(id(stage))
            base = stage.base.replace("${KILN_DEVICE}", device).replace("$KILN_DEVICE", device)
            if base not in by_name:
                return stage, base
            stage = by_name[base]
        return stage, stage.base if stage else ""

    build = next((s for s in stages if any("scripts/build" in a for a in s.all("RUN"))), None)
    if build is None:
        problems.append(f"{where}: no stage RUNs scripts/build (the build the test command runs)")
    else:
        if not any(re.search(r"scripts/install-deps\b.*--image", a) for a in build.all("RUN")):
            problems.append(f"{where}: the build stage does not RUN scripts/install-deps --image")
        if not any("-DKILN_CUDA=" in a for a in build.all("RUN")):
            problems.append(f"{where}: the build stage's scripts/build gets no -DKILN_CUDA=")
        for device, want_cuda, pattern in (
                ("cuda", "ON", r"^nvidia/cuda:\S*cudnn-devel-ubuntu24\.04$"),
                ("cpu", "OFF", r"^(debian:12|ubuntu:24\.04)(-slim)?$")):
            stage, image = resolve(build, device)
            if not re.match(pattern, image):
                problems.append(f"{where}: KILN_DEVICE={device} builds on {image!r}, "
                                f"not an image matching {pattern}")
            # ENV KILN_CUDA may sit in the base stage or in the build stage itself.
            env = {**stage.env(), **build.env()}
            if env.get("KILN_CUDA") != want_cuda:
                problems.append(f"{where}: KILN_DEVICE={device} builds with KILN_CUDA="
                                f"{env.get('KILN_CUDA')!r}, not {want_cuda}")

    final = stages[-1]
    for device, pattern in (("cuda", r"^nvidia/cuda:\S*cudnn-runtime-ubuntu24\.04$"),
                            ("cpu", r"^(debian:12|ubuntu:24\.04)(-slim)?$")):
        _, image = resolve(final, device)
        if not re.match(pattern, image):
            problems.append(f"{where}: KILN_DEVICE={device} runs on {image!r}, "
                            f"not an image matching {pattern}")
    if build is not None:
        cuda_build = resolve(build, "cuda")[1].split(":")[-1].split("-")[0]
        cuda_run = resolve(final, "cuda")[1].split(":")[-1].split("-")[0]
        if cuda_build != cuda_run:
            problems.append(f"{where}: CUDA version of the build ({cuda_build}) and the runtime "
                            f"({cuda_run}) differ")

    # The runtime stage carries the binaries, not the build tree.
    copied = [c for c in map(dockerfile_parser.copy_from, final.all("COPY")) if c]
    sources = [p for _, paths, _ in copied for p in paths]
    for binary in ("kilnd", "kiln"):
        if not any(os.path.basename(p) == binary for p in sources):
            problems.append(f"{where}: the runtime stage does not COPY {binary} from the build")
    workdirs = {w.rstrip("/") for s in stages for w in s.all("WORKDIR")}
    for path in sources:
        if path.endswith("/") or path.rstrip("/") in workdirs | {w + "/build" for w in workdirs}:
            problems.append(f"{where}: the runtime stage copies a whole tree ({path})")

    users = final.all("USER")
    user = users[-1].split(":")[0] if users else "root"
    if user in ("root", "0"):
        problems.append(f"{where}: the runtime stage runs as root (no USER, or USER root)")
    elif not user.isdigit():
        problems.append(f"{where}: USER {user} is not numeric (runAsNonRoot cannot verify it)")

    env, ports, volumes, _ = image_contract(root)
    problems += unknown_flag_vars(where, env, kilnd_flags(root))
    for flag in ("state_dir", "data_dir"):
        path = env.get(f"FLAGS_{flag}")
        if not path:
            problems.append(f"{where}: no ENV FLAGS_{flag}")
        elif not any(under(path, v) for v in volumes):
            problems.append(f"{where}: FLAGS_{flag}={path} is on no VOLUME {sorted(volumes)}")
    for flag in ("listen", "metrics_listen"):
        host, port = host_port(env.get(f"FLAGS_{flag}", ""))
        if host != "0.0.0.0":
            problems.append(f"{where}: FLAGS_{flag} does not bind 0.0.0.0 (kilnd's default is "
                            f"loopback, unreachable from outside the container)")
        if port not in ports:
            problems.append(f"{where}: FLAGS_{flag} port {port} is not EXPOSEd ({sorted(ports)})")

    checks = final.all("HEALTHCHECK")
    if not checks or not re.search(r"\bCMD\b.*\bkiln\b.*\bhealth\b", checks[-1]):
        problems.append(f"{where}: no HEALTHCHECK CMD running `kiln ... health`")
    entry = final.all("ENTRYPOINT")
    if not entry:
        problems.append(f"{where}: no ENTRYPOINT")
    else:
        words = yaml.safe_load(entry[-1]) if entry[-1].startswith("[") else entry[-1].split()
        program = os.path.basename(words[0]) if words else ""
        script = os.path.join("deploy/image", program)
        if program == "kilnd":
            pass
        elif not os.path.isfile(os.path.join(root, script)):
            problems.append(f"{where}: ENTRYPOINT {program!r} is neither kilnd nor in deploy/image")
        elif not re.search(r"^\s*exec kilnd\b", read(root, script), re.M):
            problems.append(f"{script}: does not exec kilnd")
    return problems


# ---------------------------------------------------------------------------------------------
# docker-compose


def compose_env_defaults(root):
    values = {}
    path = os.path.join(root, COMPOSE_ENV)
    if os.path.isfile(path):
        for line in read(root, COMPOSE_ENV).splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and not key.startswith("#"):
                values[key.strip()] = value.strip()
    return values


def short_volumes(service):
    """{container path: source} of a service's volumes in short syntax."""
    mounts = {}
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            if len(parts) >= 2:
                mounts[parts[1]] = parts[0]
        elif isinstance(v, dict):
            mounts[v.get("target")] = v.get("source")
    return mounts


def environment(service):
    """A service's environment as a dict, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return env


def published_targets(service):
    targets = set()
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            targets.add(int(p.get("target")))
        else:
            targets.add(int(str(p).split(":")[-1].split("/")[0]))
    return targets


def gpu_reserved(service):
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations")
               or {}).get("devices") or []
    return any(d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])
               for d in devices)


def check_compose(root, contract=None):
    """The compose file against the image's contract (the Dockerfile's, unless given)."""
    problems = []
    where = COMPOSE
    docs = load_yaml(root, COMPOSE)
    services = (docs[0] if docs else {}).get("services") or {}
    env, ports, volumes, _ = contract or image_contract(root)
    flags = kilnd_flags(root)

    # The kilnd variants: services built from the Dockerfile.
    kilnds = {n: s for n, s in services.items() if isinstance(s.get("build"), dict)
              and os.path.normpath(os.path.join("deploy", s["build"].get("context", "."))) == "."}
    gpu = {n: s for n, s in kilnds.items() if gpu_reserved(s)}
    cpu = {n: s for n, s in kilnds.items() if "cpu" in (s.get("profiles") or [])}
    if not gpu:
        problems.append(f"{where}: no kilnd service reserves a GPU (deploy.resources.reservations"
                        f".devices with driver nvidia, capabilities [gpu])")
    if not cpu:
        problems.append(f"{where}: no kilnd service in a \"cpu\" profile")
    for name, s in cpu.items():
        if gpu_reserved(s):
            problems.append(f"{where}: {name} is in the cpu profile but reserves a GPU")
        if (s["build"].get("args") or {}).get("KILN_DEVICE") != "cpu":
            problems.append(f"{where}: {name} is in the cpu profile but not built with "
                            f"KILN_DEVICE: cpu")
    for name, s in gpu.items():
        if (s["build"].get("args") or {}).get("KILN_DEVICE", "cuda") != "cuda":
            problems.append(f"{where}: {name} reserves a GPU but is not built with "
                            f"KILN_DEVICE: cuda")
    # Only one variant may start: each has a profile, and the default (.env) picks the GPU one.
    for name, s in kilnds.items():
        if not s.get("profiles"):
            problems.append(f"{where}: {name} has no profile, so it starts beside every variant")
    default = compose_env_defaults(root).get("COMPOSE_PROFILES", "").split(",")
    for name, s in gpu.items():
        if not set(s.get("profiles") or []) & set(default):
            problems.append(f"{COMPOSE_ENV}: COMPOSE_PROFILES={','.join(default)} does not start "
                            f"{name} by default (plain `docker compose up`)")

    for name, s in kilnds.items():
        problems += unknown_flag_vars(f"{where}: {name}", environment(s), flags)
        mounts = short_volumes(s)
        for v in volumes:
            if v not in mounts:
                problems.append(f"{where}: {name} mounts nothing at the image's VOLUME {v}")
        missing = ports - published_targets(s)
        if missing:
            problems.append(f"{where}: {name} does not publish port(s) {sorted(missing)}")

    # Prometheus scrapes kilnd by a name every variant answers to.
    prometheus = services.get("prometheus")
    if prometheus is None:
        problems.append(f"{where}: no prometheus service")
    else:
        source = short_volumes(prometheus).get("/etc/prometheus/prometheus.yml")
        if not source:
            problems.append(f"{where}: prometheus mounts no /etc/prometheus/prometheus.yml")
        else:
            config = load_yaml(root, os.path.normpath(os.path.join("deploy", source)))[0]
            targets = [t for job in config.get("scrape_configs") or []
                       for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
            _, metrics_port = host_port(env.get("FLAGS_metrics_listen", ""))
            for name, s in kilnds.items():
                aliases = {name}
                for network in (s.get("networks") or {}).values():
                    aliases.update((network or {}).get("aliases") or [])
                scraped = [t for t in targets if t in {f"{a}:{metrics_port}" for a in aliases}]
                if not scraped:
                    problems.append(f"{where}: prometheus ({source}) scrapes {targets}, not "
                                    f"{name} at port {metrics_port} by any of {sorted(aliases)}")
                # kilnd refuses Host names it was not told of (DNS rebinding): 403 to scrapes.
                allowed = environment(s).get("FLAGS_http_allowed_hosts", "").split(",")
                for target in scraped:
                    host = target.rsplit(":", 1)[0]
                    if host not in allowed and host != "localhost":
                        problems.append(f"{where}: {name} does not allow Host {host} "
                                        f"(FLAGS_http_allowed_hosts), so it answers prometheus's "
                                        f"scrapes of {target} with 403")

    # Grafana gets the provisioning and the dashboards where the provisioning looks for them.
    grafana = services.get("grafana")
    if grafana is None:
        problems.append(f"{where}: no grafana service")
    else:
        mounts = short_volumes(grafana)
        for kind in ("datasources", "dashboards"):
            target = f"/etc/grafana/provisioning/{kind}"
            if os.path.normpath(mounts.get(target, "")) != f"grafana/provisioning/{kind}":
                problems.append(f"{where}: grafana does not mount ./grafana/provisioning/{kind} "
                                f"at {target}")
        for provider_file in sorted(os.listdir(os.path.join(root, "deploy/grafana/provisioning/"
                                                                  "dashboards"))):
            rel = f"deploy/grafana/provisioning/dashboards/{provider_file}"
            for provider in load_yaml(root, rel)[0].get("providers") or []:
                path = (provider.get("options") or {}).get("path")
                if os.path.normpath(mounts.get(path, "")) != "grafana/dashboards":
                    problems.append(f"{where}: grafana does not mount ./grafana/dashboards at "
                                    f"{path} (where {rel} reads them)")
        for source_file in sorted(os.listdir(os.path.join(root, "deploy/grafana/provisioning/"
                                                                "datasources"))):
            rel = f"deploy/grafana/provisioning/datasources/{source_file}"
            for source in load_yaml(root, rel)[0].get("datasources") or []:
                host = re.sub(r"^\w+://", "", source.get("url", "")).split(":")[0].split("/")[0]
                if host not in services:
                    problems.append(f"{rel}: data source url {source.get('url')} names no "
                                    f"compose service")
    return problems


# ---------------------------------------------------------------------------------------------
# Kubernetes


def check_kubernetes(root, contract=None):
    """deploy/k8s against the image's contract (the Dockerfile's, unless given)."""
    contract = contract or image_contract(root)
    problems = []
    kustomization = f"{K8S}/kustomization.yaml"
    if not os.path.isfile(os.path.join(root, kustomization)):
        return [f"{kustomization}: missing"]
    resources = load_yaml(root, kustomization)[0].get("resources") or []
    files = sorted(f for f in os.listdir(os.path.join(root, K8S))
                   if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml")
    for f in files:
        if f not in resources:
            problems.append(f"{kustomization}: {f} is not in resources")
    objects = {}  # kind -> [(file, object)]
    for rel in resources:
        if not os.path.isfile(os.path.join(root, K8S, rel)):
            problems.append(f"{kustomization}: resource {rel} does not exist")
            continue
        for doc in load_yaml(root, f"{K8S}/{rel}"):
            objects.setdefault(doc.get("kind"), []).append((f"{K8S}/{rel}", doc))
    for kind in ("Deployment", "Service", "PersistentVolumeClaim", "ConfigMap", "ServiceMonitor"):
        if kind not in objects:
            problems.append(f"{kustomization}: no {kind} among the resources")
    if "Deployment" not in objects:
        return problems

    where, deployment = objects["Deployment"][0]
    spec = deployment.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    pod_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    containers = pod.get("containers") or [{}]
    container = containers[0]
    if spec.get("replicas") != 1:
        problems.append(f"{where}: replicas is {spec.get('replicas')}, not 1 (one SQLite store)")
    if (spec.get("strategy") or {}).get("type") != "Recreate":
        problems.append(f"{where}: strategy is not Recreate (two kilnds would share the store)")

    images = load_yaml(root, kustomization)[0].get("images") or []
    image = str(container.get("image", "")).split(":")[0]
    if images and image not in {i.get("name") for i in images}:
        problems.append(f"{where}: image {image} is not the one kustomization.yaml's images sets")

    container_ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    grpc_port, metrics_port = container_ports.get("grpc"), container_ports.get("metrics")
    if grpc_port is None or metrics_port is None:
        problems.append(f"{where}: the container has no ports named grpc and metrics")

    resources_ = container.get("resources") or {}
    limits, requests = resources_.get("limits") or {}, resources_.get("requests") or {}
    if int(limits.get("nvidia.com/gpu", 0) or 0) < 1:
        problems.append(f"{where}: no nvidia.com/gpu limit")
    for key, table in (("cpu", requests), ("memory", requests), ("memory", limits)):
        if key not in table:
            problems.append(f"{where}: no {key} in resources."
                            f"{'requests' if table is requests else 'limits'}")

    for probe_name in ("livenessProbe", "readinessProbe"):
        probe = container.get(probe_name) or {}
        grpc = probe.get("grpc")
        if not isinstance(grpc, dict):
            problems.append(f"{where}: {probe_name} is not a native gRPC probe")
            continue
        if grpc.get("port") != grpc_port:
            problems.append(f"{where}: {probe_name} probes port {grpc.get('port')}, "
                            f"not the grpc port {grpc_port}")
        if grpc.get("service", "") not in GRPC_HEALTH_SERVICES:
            problems.append(f"{where}: {probe_name} asks for service {grpc.get('service')!r}, "
                            f"which kilnd's health service does not know")

    pod_security = pod.get("securityContext") or {}
    security = container.get("securityContext") or {}
    if not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
        problems.append(f"{where}: runAsNonRoot is not true")
    # The ids the pod runs as are the image's user, and fsGroup its group (which owns the
    # volume's folders in the image), so that kilnd can write the state it finds there.
    user, _, group = contract.user.partition(":")
    for key, want in (("runAsUser", user), ("runAsGroup", group), ("fsGroup", group)):
        have = security.get(key, pod_security.get(key))
        if want.isdigit() and have is not None and have != int(want):
            problems.append(f"{where}: {key} {have} is not the image's (USER {contract.user})")
    if security.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{where}: readOnlyRootFilesystem is not true")
    if security.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: allowPrivilegeEscalation is not false")

    # The flags: a ConfigMap the container reads, naming real flags, matching the ports.
    configmaps = {o.get("metadata", {}).get("name"): o for _, o in objects.get("ConfigMap", [])}
    referenced = [e["configMapRef"].get("name") for e in container.get("envFrom") or []
                  if "configMapRef" in e]
    if not any(name in configmaps for name in referenced):
        problems.append(f"{where}: the container's envFrom references none of the ConfigMaps "
                        f"{sorted(configmaps)}")
    flags_env = dict(contract.env)
    for name in referenced:
        data = (configmaps.get(name) or {}).get("data") or {}
        problems += unknown_flag_vars(f"{K8S} ConfigMap {name}", data, kilnd_flags(root))
        flags_env.update(data)
    for e in container.get("env") or []:
        flags_env[e.get("name")] = e.get("value", "")
    for flag, port in (("listen", grpc_port), ("metrics_listen", metrics_port)):
        host, flag_port = host_port(flags_env.get(f"FLAGS_{flag}", ""))
        if host != "0.0.0.0" or flag_port != port:
            problems.append(f"{where}: FLAGS_{flag}={flags_env.get(f'FLAGS_{flag}')} does not "
                            f"bind 0.0.0.0 on the container's port {port}")
    timeout = seconds(flags_env.get("FLAGS_shutdown_timeout", f"{DEFAULT_SHUTDOWN_TIMEOUT_S}s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if timeout is None or grace <= timeout:
        problems.append(f"{where}: terminationGracePeriodSeconds {grace} is not longer than "
                        f"kilnd's shutdown timeout {flags_env.get('FLAGS_shutdown_timeout')}")

    # Read-only root: the state dir, the data dir and /tmp are writable volumes, the first two
    # on a claim this kustomization creates.
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    claims = {o.get("metadata", {}).get("name")
              for _, o in objects.get("PersistentVolumeClaim", [])}
    mounts = [m for m in container.get("volumeMounts") or [] if not m.get("readOnly")]
    for label, path in (("state dir", flags_env.get("FLAGS_state_dir")),
                        ("data dir", flags_env.get("FLAGS_data_dir")), ("tmp dir", "/tmp")):
        mount = next((m for m in sorted(mounts, key=lambda m: -len(m.get("mountPath", "")))
                      if path and under(path, m.get("mountPath", ""))), None)
        if mount is None:
            problems.append(f"{where}: the {label} {path} is on no writable volume "
                            f"(the root filesystem is read-only)")
            continue
        volume = volumes.get(mount.get("name"))
        if volume is None:
            problems.append(f"{where}: volumeMount {mount.get('name')} has no volume")
        elif label != "tmp dir":
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim not in claims:
                problems.append(f"{where}: the {label} is not on a PersistentVolumeClaim of this "
                                f"kustomization ({sorted(c for c in claims if c)})")

    # The Service selects the pod and exposes both container ports; the ServiceMonitor scrapes
    # the Service's metrics port.
    for svc_where, service in objects.get("Service", []):
        svc_spec = service.get("spec") or {}
        selector = svc_spec.get("selector") or {}
        if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
            problems.append(f"{svc_where}: selector {selector} does not select the kilnd pod")
        exposed = {}
        for p in svc_spec.get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            exposed[p.get("name")] = container_ports.get(target, target)
            if exposed[p.get("name")] not in container_ports.values():
                problems.append(f"{svc_where}: port {p.get('name')} targets {target}, which is no "
                                f"container port {sorted(container_ports.values())}")
        for port in (grpc_port, metrics_port):
            if port not in exposed.values():
                problems.append(f"{svc_where}: does not expose container port {port}")
        for mon_where, monitor in objects.get("ServiceMonitor", []):
            mon_spec = monitor.get("spec") or {}
            match = (mon_spec.get("selector") or {}).get("matchLabels") or {}
            labels = (service.get("metadata") or {}).get("labels") or {}
            if not match or any(labels.get(k) != v for k, v in match.items()):
                problems.append(f"{mon_where}: selector {match} does not select Service "
                                f"{service['metadata'].get('name')}")
            for endpoint in mon_spec.get("endpoints") or [{}]:
                if exposed.get(endpoint.get("port")) != metrics_port:
                    problems.append(f"{mon_where}: endpoint port {endpoint.get('port')} is not "
                                    f"the Service's metrics port")
    return problems


# ---------------------------------------------------------------------------------------------
# Grafana dashboards

# An expr that ends so, shows 0 rather than "no data" when what it counts has no series.
ZERO_FALLBACK = re.compile(r"\bor\s+(on\s*\(\s*\)\s*)?vector\(\s*0\s*\)\s*$")
JOB_MATCHER = re.compile(r'\bjob\s*(?:=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
LABEL_VALUES_JOB = re.compile(r"label_values\([^)]*,\s*job\s*\)")


def datasource_refs(node, where):
    """(where, value) of every "datasource" key in a dashboard, panels and targets included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield where, value
            else:
                yield from datasource_refs(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from datasource_refs(child, f"{where}[{i}]")


def all_panels(panels):
    """Every panel, those inside collapsed rows included."""
    for panel in panels or []:
        yield panel
        yield from all_panels(panel.get("panels"))


def scrape_jobs(root):
    """The job names deploy/prometheus/prometheus.yml scrapes under."""
    docs = load_yaml(root, PROMETHEUS_CONFIG)
    return {job.get("job_name") for job in (docs[0] if docs else {}).get("scrape_configs") or []}


def check_grafana(root):
    problems = []
    jobs = scrape_jobs(root)
    for name in sorted(os.listdir(os.path.join(root, GRAFANA_DASHBOARDS))):
        if not name.endswith(".json"):
            continue
        where = f"{GRAFANA_DASHBOARDS}/{name}"
        try:
            dashboard = json.loads(read(root, where))
        except ValueError as e:
            problems.append(f"{where}: not JSON ({e})")
            continue
        # The data source is a variable, so the dashboard works on any Grafana whatever its
        # Prometheus data source's uid (an imported copy, kube-prometheus-stack's).
        variables = (dashboard.get("templating") or {}).get("list") or []
        ds_vars = [v.get("name") for v in variables
                   if v.get("type") == "datasource" and v.get("query") == "prometheus"]
        if not ds_vars:
            problems.append(f"{where}: no data source variable (a templating variable of type "
                            f"datasource, query prometheus)")
        allowed = {f"${n}" for n in ds_vars} | {f"${{{n}}}" for n in ds_vars}
        for ref, ds in datasource_refs(dashboard, ""):
            if ds is None:  # rows; Grafana's default
                continue
            uid = ds.get("uid") if isinstance(ds, dict) else ds
            if uid not in allowed:
                problems.append(f"{where}: {ref} names data source {uid!r}, a fixed one, not "
                                f"the data source variable")
        for v in variables:
            definition = json.dumps(v.get("query")) + str(v.get("definition", ""))
            if v.get("type") == "query" and LABEL_VALUES_JOB.search(definition):
                problems.append(f"{where}: variable {v.get('name')} lists `job` values: the "
                                f"per-job label is job_id (job is the scrape job's)")
        for panel in all_panels(dashboard.get("panels")):
            title = panel.get("title", "")
            for target in panel.get("targets") or []:
                expr = target.get("expr", "")
                at = f"{where}: panel {title!r} target {target.get('refId')}"
                # `job` is the scrape job's (prometheus.yml); kilnd's per-job label is job_id.
                for value in JOB_MATCHER.findall(expr):
                    if value not in jobs:
                        problems.append(f"{at} matches job=\"{value}\", which is no scrape job "
                                        f"of {PROMETHEUS_CONFIG} {sorted(jobs)}: the per-job "
                                        f"label is job_id")
                for labels in GROUPING.findall(expr):
                    if "job" in [label.strip() for label in labels.split(",")]:
                        problems.append(f"{at} groups by `job`: the per-job label is job_id")
                if "{{job}}" in target.get("legendFormat", ""):
                    problems.append(f"{at} shows {{{{job}}}}: the per-job label is job_id")
                if "error" in title.lower() and not ZERO_FALLBACK.search(expr):
                    problems.append(f"{at} shows no data rather than 0 while there are no errors "
                                    f"(end it with `or on () vector(0)`): {expr}")
    return problems


def check_kubernetes_distributed(root):
    """The workers of a data-parallel job: an Indexed Job whose pods take their rank from the
    completion index, reach kilnd's Service, present the job's token from a secret, publish an
    address their peers can reach, and take one GPU each; a headless Service over them."""
    problems = []
    kustomization = f"{K8S_DISTRIBUTED}/kustomization.yaml"
    if not os.path.isfile(os.path.join(root, kustomization)):
        return [f"{kustomization}: missing"]
    kust = load_yaml(root, kustomization)[0]
    objects = {}
    for rel in kust.get("resources") or []:
        if not os.path.isfile(os.path.join(root, K8S_DISTRIBUTED, rel)):
            problems.append(f"{kustomization}: resource {rel} does not exist")
            continue
        for doc in load_yaml(root, f"{K8S_DISTRIBUTED}/{rel}"):
            objects.setdefault(doc.get("kind"), []).append((f"{K8S_DISTRIBUTED}/{rel}", doc))
    if "Job" not in objects:
        return problems + [f"{kustomization}: no Job among the resources"]
    where, job = objects["Job"][0]
    spec = job.get("spec") or {}
    if spec.get("completionMode") != "Indexed":
        problems.append(f"{where}: completionMode is not Indexed (no rank per pod)")
    if spec.get("completions") != spec.get("parallelism"):
        problems.append(f"{where}: completions and parallelism differ; every rank must run at once")
    pod = (spec.get("template") or {}).get("spec") or {}
    pod_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    container = (pod.get("containers") or [{}])[0]
    if "kiln-worker" not in (container.get("command") or []):
        problems.append(f"{where}: the container does not run kiln-worker")
    env = {e.get("name"): e for e in container.get("env") or []}
    if "KILN_RANK" in env:
        problems.append(f"{where}: KILN_RANK is set; the rank must come from JOB_COMPLETION_INDEX")
    coordinator = str((env.get("KILN_COORDINATOR") or {}).get("value", ""))
    services = {doc.get("metadata", {}).get("name") for _, doc in load_k8s_services(root)}
    if coordinator.split(":")[0] not in services:
        problems.append(f"{where}: KILN_COORDINATOR {coordinator!r} is not kilnd's Service")
    token = env.get("KILN_WORKER_TOKEN") or {}
    if "secretKeyRef" not in (token.get("valueFrom") or {}):
        problems.append(f"{where}: KILN_WORKER_TOKEN does not come from a secret")
    if "KILN_JOB" not in env:
        problems.append(f"{where}: no KILN_JOB")
    if "KILN_GLOO_HOST" not in env and "KILN_GLOO_INTERFACE" not in env:
        problems.append(f"{where}: neither KILN_GLOO_HOST nor KILN_GLOO_INTERFACE: peers "
                        "would be told 127.0.0.1")
    limits = (container.get("resources") or {}).get("limits") or {}
    if int(limits.get("nvidia.com/gpu", 0) or 0) != 1:
        problems.append(f"{where}: not one nvidia.com/gpu per worker")
    headless = [(w, d) for w, d in objects.get("Service", [])
                if (d.get("spec") or {}).get("clusterIP") == "None"]
    if not headless:
        problems.append(f"{kustomization}: no headless Service (clusterIP: None) over the workers")
    else:
        w, service = headless[0]
        selector = (service.get("spec") or {}).get("selector") or {}
        if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
            problems.append(f"{w}: its selector does not match the worker pods' labels")
        if pod.get("subdomain") != service.get("metadata", {}).get("name"):
            problems.append(f"{where}: the pods' subdomain is not the headless Service's name")
    return problems


def load_k8s_services(root):
    """kilnd's Services (deploy/k8s), as (file, object)."""
    found = []
    for f in sorted(os.listdir(os.path.join(root, K8S))):
        if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml":
            found += [(f, d) for d in load_yaml(root, f"{K8S}/{f}") if d.get("kind") == "Service"]
    return found


def check_all(root):
    return (check_dockerfile(root) + check_compose(root) + check_kubernetes(root)
            + check_kubernetes_distributed(root) + check_grafana(root))
