"""Kubernetes manifests for one target: a Deployment and a Service that run the image the way its
recipe runs it, translated from `docker run` flags to what a cluster offers."""

from __future__ import annotations

import math
import re
import textwrap
from urllib.parse import urlsplit

import yaml

from gemma4_images.spec import measured as measured_figures
from gemma4_images.spec import platforms
from gemma4_images.spec.image_code import gemma4_serve
from gemma4_images.spec.matrix import Matrix, MatrixError, model_path
from gemma4_images.spec.reference import Reference

# Not /root/.cache/huggingface as in `docker run`: /root is 0700 in the images, so a non-root pod
# cannot reach it (measured). One path for every target, named by HF_HOME.
HF_HOME = "/var/cache/huggingface"
# vLLM's own caches (VLLM_CACHE_ROOT, vllm/envs.py; default ~/.cache/vllm): torch.compile's artifacts
# (torch_compile_cache/, with inductor's and triton's caches, vllm/compilation) and the model info the
# entrypoint seeds; the family's other compile caches are pointed into it (families.*.kubernetes.
# compile_cache). On a volume, a pod starts from what an earlier one compiled (BENCHMARKS.md, "What a
# pod needs").
COMPILE_CACHE = "/var/cache/vllm"
# Where a family that reads its compile cache from local disk only (Gaudi) finds the shared claim, which
# an init container copies into the pod's own volume.
COMPILE_CACHE_SEED = "/var/cache/vllm-seed"
NON_ROOT_UID = 2000  # the uid the CPU smoke tier runs as
HTTP = "http"
# Ready = /health answers and /v1/models lists the served model: the image's own check, on the
# port and model name the entrypoint recorded when it started the server.
READY_COMMAND = ["gemma4-serve", "--ready"]
# A writable /tmp for a read-only root: vLLM, torch.compile and HOME (set by the entrypoint for a
# uid without an account) write there. An emptyDir allows exec, which torch.compile needs.
TMP = "/tmp"
# A model image (`build.py model-image`) reaches the pod as an `image` volume (KEP-4639; beta and on
# by default from Kubernetes 1.35, subPath from 1.33): read-only files at /models/<name>, as in
# the image, so nothing is downloaded and the entrypoint serves that path with the hub offline.
MODEL_VOLUME = "model"
IMAGE_VOLUME_SINCE = "1.33"
# Before SIGTERM, the pod waits this long (a preStop sleep: Kubernetes' sleep hook, on by default from
# 1.30, KEP-3960), so that endpoints and load balancers stop sending it new requests first; the
# grace period counts it too, so it must leave vLLM's own shutdown its time.
PRESTOP_S = 5
GRACE_WHY = (
    "on SIGTERM vLLM aborts what is in flight, ends each request with a 503 (shutdown-ends-requests) "
    "and exits 0: measured 1-3 s on the CPU tier during traffic, not yet on accelerators; raise it "
    "above --shutdown-timeout if you pass one"
)


# -- what a cluster accepts, checked before anything is printed -------------------------------------

# Deployment and LeaderWorkerSet spec.replicas and KEDA's min/maxReplicaCount are int32s (the API
# reference; the KEDA CRD schema in tests/data/crds/: format int32, minimum 0).
REPLICAS = range(0, 2**31)
# PVC and Secret names are DNS-1123 subdomains (kubernetes.io/docs/concepts/overview/working-with-objects/names).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_MAX = 253


def object_name(name: str, option: str) -> str:
    """name when a PersistentVolumeClaim or Secret may carry it, else one line."""
    if len(name) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(name):
        raise MatrixError(
            f"{option} {name!r} is not a Kubernetes object name (a DNS-1123 subdomain): at most "
            f"{DNS_SUBDOMAIN_MAX} lowercase letters, digits, '-' and '.', a letter or digit at each end"
        )
    return name


def server_url(url: str, option: str) -> str:
    """url when KEDA's Prometheus scaler can query it: http(s)://HOST[:PORT][/PATH], as its
    serverAddress is given (keda.sh/docs, scalers/prometheus: `http://<prometheus-host>:9090`)."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port in gemma4_serve.PORTS
    except ValueError:  # urlsplit's answer for a port it cannot read (beyond 65535, not a number)
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise MatrixError(
            f"{option} {url!r} is not an http(s) URL of a Prometheus server; give http(s)://HOST[:PORT][/PATH] "
            f"(default {PROMETHEUS})"
        )
    return url


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people: no &anchors for repeated maps, scripts as literal blocks."""

    def ignore_aliases(self, data):
        return True


_Dumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None),
)


def quantity(docker_size: str) -> str:
    """docker's --shm-size (binary units: 16G = 16 GiB) as a Kubernetes quantity."""
    number, unit = re.fullmatch(r"(\d+)([bkmgBKMG]?)", docker_size).groups()
    return number + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit.lower()]


def shm_size(matrix: Matrix, name: str) -> str:
    """/dev/shm as the recipe sizes it. --ipc=host (the host's /dev/shm, unbounded) is not given to
    pods: it shares the node's IPC namespace with every such pod; a memory-backed emptyDir as large
    as the recipes that do size it (16G) stands in. CPU: what its smoke tier measured, 1Gi at least."""
    t = matrix.targets[name]
    if t.run.shm_size:
        return quantity(t.run.shm_size)
    if matrix.families[t.family].accelerator == "none":
        measured = quantity(t.smoke.shm_size or "1g")
        return measured if measured.endswith("Gi") and int(measured[:-2]) >= 1 else "1Gi"
    return "16Gi"


def _model_pieces(reference: str, name: str) -> dict:
    """The pod's volume, the container's mount and env for a model image holding /models/<name>."""
    return {
        "volume": {"name": MODEL_VOLUME, "image": {"reference": reference, "pullPolicy": "IfNotPresent"}},
        "volumeMount": {
            "name": MODEL_VOLUME,
            "mountPath": model_path(name),
            "subPath": model_path(name).lstrip("/"),
            "readOnly": True,
        },
        "env": {"name": "GEMMA4_MODEL", "value": model_path(name)},
    }


def busy_processes(devices: int) -> int:
    """vLLM's processes that each keep a core busy: the API server, the engine core (which runs the
    model itself on one device), and one worker per device when there are more (multiprocessing)."""
    return 2 + (devices if devices > 1 else 0)


def resources(matrix: Matrix, name: str) -> tuple[dict, str]:
    """(the container's resources, the header note saying where each figure comes from). Memory on
    the CPU family: the working set of random weights of E2B's shape serving the recipe's load in
    this image (make bench --fullsize), when measured; elsewhere (and until then) the server's
    working set as measured on the CPU tier, the checkpoint, and the KV cache when the host holds it.
    Requests only (no ceiling to kill a pod at before `kubectl top pod` has seen E2B's own)."""
    t, family = matrix.targets[name], _family(matrix, name)
    host, resource = family.kubernetes.resources, family.kubernetes.device_resource
    measured = measured_figures.pod_memory()
    full = measured_figures.fullsize_memory() if host.kv_cache_gib else None
    if full:
        kv_delta = (host.kv_cache_gib - full["kv_cache_gib"]) * measured["per_kv_gib"]
        memory_gib = math.ceil((full["working_set"] + kv_delta) / 2**30)
        terms = [
            f"the working set of random weights of E2B's shape (10.2 GB, its exact configuration) serving the "
            f"recipe's launch and load with VLLM_CPU_KVCACHE_SPACE={full['kv_cache_gib']}, "
            f'{full["working_set"] / 2**30:.1f} GiB (measured, BENCHMARKS.md "E2B at its real size")',
            *([f"{kv_delta / 2**30:+.1f} GiB for VLLM_CPU_KVCACHE_SPACE={host.kv_cache_gib}"] if kv_delta else []),
        ]
    else:
        kv = (host.kv_cache_gib or 0) * measured["per_kv_gib"]
        checkpoint = matrix.project.checkpoint_gb * 1e9
        memory_gib = math.ceil((measured["server"] + checkpoint + kv) / 2**30)
        terms = [
            f'the server {measured["server"] / 2**30:.1f} GiB (measured, BENCHMARKS.md "What a pod needs")',
            f"the checkpoint {matrix.project.checkpoint_gb} GB",
            *([f"the KV cache {kv / 2**30:.1f} GiB (VLLM_CPU_KVCACHE_SPACE={host.kv_cache_gib})"] if kv else []),
        ]
    cpus = host.cpus or busy_processes(t.kubernetes.devices)
    out = {"requests": {"cpu": str(cpus), "memory": f"{memory_gib}Gi"}}
    if resource:
        out["limits"] = {resource: t.kubernetes.devices}
    cpu_why = (
        f"{cpus} cores (targets.yaml families.{t.family}.kubernetes.resources)"
        if host.cpus
        else f"{cpus} cores, one per busy vLLM process (the API server, the engine core"
        + (f", {t.kubernetes.devices} workers)" if t.kubernetes.devices > 1 else ")")
    )
    unmeasured = "" if full else "E2B's own working set is not measured here; "
    note = (
        f"resources.requests: {cpu_why}; memory {memory_gib}Gi = " + " + ".join(terms) + f" ({host.why}). "
        f"No limits besides the device: {unmeasured}after `kubectl top pod` on "
        "a serving pod, set limits = requests for Guaranteed QoS (and the static CPU manager's whole cores)."
    )
    return out, note


def _env(matrix: Matrix, name: str, secret: str, model: dict | None = None) -> list[dict]:
    t = matrix.targets[name]
    family = matrix.families[t.family]
    # The family's ENV (in the image too, spelled out here) and the recipe's `docker run -e` values,
    # less those the device plugin sets per pod.
    env = {**family.env, **{k: v for k, v in t.run.env.items() if k not in family.kubernetes.plugin_env}}
    out = [{"name": k, "value": v} for k, v in env.items()]
    out.append({"name": "HF_HOME", "value": HF_HOME})
    out.append({"name": "VLLM_CACHE_ROOT", "value": COMPILE_CACHE})
    for key, value in family.kubernetes.compile_cache.env.items():
        out.append({"name": key, "value": value.format(cache=COMPILE_CACHE)})
    kv = family.kubernetes.resources.kv_cache_gib
    if kv:  # else vLLM's CPU worker reserves 90% of the node's memory, whatever the pod asked for
        out.append({"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(kv)})
    if model:
        out.append(model["env"])  # served from the image's files: no token, no download
    else:
        out.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token", "optional": True}}}
        )
    return out


def _security(matrix: Matrix, name: str) -> tuple[dict, dict]:
    """(pod securityContext, container securityContext), from the family's kubernetes.security."""
    mode = _family(matrix, name).kubernetes.security.mode
    if mode == "non-root":
        # fsGroup makes the cache volume writable for the uid.
        return (
            {
                "runAsNonRoot": True,
                "runAsUser": NON_ROOT_UID,
                "fsGroup": NON_ROOT_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True},
        )
    if mode == "root":
        return {}, {"allowPrivilegeEscalation": False}
    if mode == "root+SYS_NICE":
        return {}, {"capabilities": {"add": ["SYS_NICE"]}}
    return {}, {"privileged": True}


def _image(matrix: Matrix, name: str, image: str | None, digest: str | None) -> str:
    ref = Reference.split(image or matrix.tag(name))
    return str(ref.with_digest(digest)) if digest and not ref.digest else str(ref)


def _container(matrix: Matrix, name: str, image: str, secret: str, requests: dict, model: dict | None = None) -> dict:
    t = matrix.targets[name]
    port = matrix.project.port
    health = {"httpGet": {"path": "/health", "port": HTTP}}
    return {
        "name": "vllm",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": HTTP, "containerPort": port}],
        "env": _env(matrix, name, secret, model),
        # The API keeps the recipe's model name when the files come from a model image.
        **({"args": ["--served-model-name", matrix.project.model]} if model else {}),
        "resources": requests,
        "securityContext": _security(matrix, name)[1],
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": HF_HOME},
            {"name": "compile-cache", "mountPath": COMPILE_CACHE},
            *([{"name": "tmp", "mountPath": TMP}] if read_only(matrix, name) else []),
            *([model["volumeMount"]] if model else []),
        ],
        # Warm-up (download, load, compile) gets the target's whole budget before liveness counts.
        "startupProbe": {
            **health,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(t.startup_budget_s / 10),
        },
        "readinessProbe": {
            "exec": {"command": READY_COMMAND},
            "periodSeconds": 10,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
        # The image's own HEALTHCHECK: every 30 s, 10 s timeout, 3 misses.
        "livenessProbe": {**health, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_S}}},
    }


def read_only(matrix: Matrix, name: str) -> bool:
    return bool(_security(matrix, name)[1].get("readOnlyRootFilesystem"))


def _family(matrix: Matrix, name: str):
    return matrix.families[matrix.targets[name].family]


def _pod(
    matrix: Matrix,
    name: str,
    container: dict,
    pvc: str | None,
    model: dict | None,
    image_platforms: list[str],
    compile_pvc: str | None = None,
) -> dict:
    t = matrix.targets[name]
    pod_sc = _security(matrix, name)[0]
    # With a model image nothing is downloaded: HF_HOME stays writable on an emptyDir.
    cache = {"persistentVolumeClaim": {"claimName": pvc}} if pvc and not model else {"emptyDir": {}}
    # An image of one platform only lands on nodes of that architecture (the well-known
    # kubernetes.io/arch node label); a multi-platform one runs wherever its index has an entry.
    only = image_platforms
    arch = {"kubernetes.io/arch": platforms.parse(only[0]).architecture} if len(only) == 1 else {}
    selector = {**arch, **t.kubernetes.node_selector}
    return {
        # SIGTERM ends the requests in flight with a 503 (shutdown-ends-requests) and vLLM exits;
        # this is how long that may take before the kubelet kills it.
        "terminationGracePeriodSeconds": t.shutdown_grace_s,
        # Kubernetes puts <SERVICE>_PORT=tcp://... in every pod's env; a Service named vllm would
        # set VLLM_PORT, which vLLM reads as its own setting and fails on.
        "enableServiceLinks": False,
        **({"securityContext": pod_sc} if pod_sc else {}),
        **({"nodeSelector": selector} if selector else {}),
        **({"initContainers": [_seed_container(container)]} if _seeded(matrix, name, compile_pvc) else {}),
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(matrix, name)}},
            {"name": "hf-cache", **cache},
            *_compile_cache_volumes(matrix, name, compile_pvc),
            *([{"name": "tmp", "emptyDir": {}}] if read_only(matrix, name) else []),
            *([model["volume"]] if model else []),
        ],
    }


def _seeded(matrix: Matrix, name: str, compile_pvc: str | None) -> bool:
    """A shared claim that the family may not use in place: copied to the pod's own volume first."""
    return bool(compile_pvc) and _family(matrix, name).kubernetes.compile_cache.local


def _compile_cache_volumes(matrix: Matrix, name: str, compile_pvc: str | None) -> list[dict]:
    """The first pod compiles into the volume; with a claim every later pod (and replica) starts
    warm, with an emptyDir only a restarted container of the same pod does."""
    if _seeded(matrix, name, compile_pvc):
        return [
            {"name": "compile-cache", "emptyDir": {}},
            {"name": "compile-cache-seed", "persistentVolumeClaim": {"claimName": compile_pvc, "readOnly": True}},
        ]
    volume = {"persistentVolumeClaim": {"claimName": compile_pvc}} if compile_pvc else {"emptyDir": {}}
    return [{"name": "compile-cache", **volume}]


def _seed_container(container: dict) -> dict:
    """Copies the shared claim's caches to the pod's own volume before the server starts."""
    return {
        "name": "seed-compile-cache",
        "image": container["image"],
        "imagePullPolicy": container["imagePullPolicy"],
        "command": ["cp", "-a", f"{COMPILE_CACHE_SEED}/.", f"{COMPILE_CACHE}/"],
        "securityContext": container["securityContext"],
        "volumeMounts": [
            {"name": "compile-cache-seed", "mountPath": COMPILE_CACHE_SEED, "readOnly": True},
            {"name": "compile-cache", "mountPath": COMPILE_CACHE},
        ],
    }


def _header(
    matrix: Matrix,
    name: str,
    pvc: str | None,
    secret: str,
    model_image: str | None,
    image_platforms: list[str],
    explain: bool,
) -> str:
    t = matrix.targets[name]
    resource = _family(matrix, name).kubernetes.device_resource
    needs = ([f"the {resource} device plugin"] if resource else []) + (
        [
            f"Kubernetes {IMAGE_VOLUME_SINCE}+ with image volumes (the ImageVolume feature, on by default "
            f"from 1.35) and a runtime that supports them, for the model image {model_image}"
        ]
        if model_image
        else ([f"PersistentVolumeClaim {pvc} (ReadWriteMany for more than one replica)"] if pvc else [])
        + [f"optionally Secret {secret} with key token (HF_TOKEN)"]
    )
    notes = [
        f"{matrix.project.image}-{name}: {matrix.project.model} on vLLM {matrix.project.vllm_version} ({t.hardware}).",
        "Generated by `python build.py k8s`. Needs: " + "; ".join(needs) + ".",
    ]
    security = _family(matrix, name).kubernetes.security
    if not explain:  # a privileged pod says why even in the short header
        privileged = [f"securityContext: {security.why}."] if security.mode == "privileged" else []
        return "".join(_wrap(note) for note in [*notes, *privileged])
    notes += [
        f"Image platforms: {', '.join(image_platforms)}"
        + (" (nodes of that architecture only)." if len(image_platforms) == 1 else " (any of those nodes)."),
        f"securityContext: {security.why}.",
        f"terminationGracePeriodSeconds: {t.shutdown_grace_s} ({GRACE_WHY}), of which the preStop "
        f"sleep takes {PRESTOP_S} s first, for the endpoints to stop sending new requests.",
        f"/dev/shm: {shm_size(matrix, name)} in memory ({_shm_reason(matrix, name)}).",
    ]
    return "".join(_wrap(note) for note in notes)


def render_k8s(
    matrix: Matrix,
    name: str,
    replicas: int = 1,
    image: str | None = None,
    digest: str | None = None,
    *,
    hf_cache_pvc: str | None = "gemma4-e2b-hf-cache",
    hf_token_secret: str = "hf-token",
    model_image: str | None = None,
    model_name: str | None = None,
    image_platforms: list[str] | None = None,
    strategy: str = "single_node_tp",
    nodes: int | None = None,
    autoscale: tuple[int, int] | None = None,
    prometheus: str | None = None,
    compile_cache_pvc: str | None = None,
    explain: bool = False,
) -> str:
    """Deployment + Service (multi-document YAML); for multi_node_tp a LeaderWorkerSet of nodes pods
    per replica instead of the Deployment (lws_set). image may already be repo@digest (from
    reports/pushed.json); hf_cache_pvc=None keeps the cache in the pod (an emptyDir). model_image
    (a `build.py model-image` reference holding /models/<model_name>) is mounted instead of the
    HF cache and token. image_platforms: the platforms the image holds (what pushed.json records
    for its digest); default the target's platforms in targets.yaml, as a full release pushes.
    autoscale (MIN, MAX): a KEDA ScaledObject on vLLM's waiting requests (scaled_object), the
    replicas starting at MIN; with more than one replica a PodDisruptionBudget (disruption_budget).
    explain: the header says why each field is what it is (else three lines and where to read that)."""
    image_platforms = image_platforms or matrix.platforms(name)
    app = f"{matrix.project.image}-{name}"
    labels = {"app.kubernetes.io/name": matrix.project.image, "app.kubernetes.io/instance": app}
    every_pod = dict(labels)
    replicas = autoscale[0] if autoscale else replicas
    prometheus = prometheus or PROMETHEUS
    on_device = _family(matrix, name).kubernetes.device_resource is not None
    model = _model_pieces(model_image, model_name) if model_image else None
    requests, requests_note = resources(matrix, name)  # benchmarks.json read once per render
    container = _container(matrix, name, _image(matrix, name, image, digest), hf_token_secret, requests, model)
    version = Reference.split(matrix.tag(name)).tag
    if strategy == "multi_node_tp":
        labels = {**labels, LWS_ROLE: "leader"}  # the Service sends requests to leaders only
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {**labels, "app.kubernetes.io/version": version}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # An accelerator node rarely has a spare device for a surge pod: replace, don't add.
            **(
                {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}
                if on_device
                else {}
            ),
            "template": {
                # Prometheus finds the API's metrics on the pods that serve it (the annotations the
                # usual kubernetes-pods scrape job reads).
                "metadata": {
                    "labels": labels,
                    "annotations": SCRAPE | {"prometheus.io/port": str(matrix.project.port)},
                },
                "spec": _pod(matrix, name, container, hf_cache_pvc, model, image_platforms, compile_cache_pvc),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": HTTP, "port": matrix.project.port, "targetPort": HTTP}]},
    }
    if strategy == "multi_node_tp":
        template = deployment["spec"]["template"]
        deployment = lws_set(deployment["metadata"], template["metadata"], replicas, nodes, template["spec"])
    dump = lambda doc: yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=110)  # noqa: E731
    header = _header(matrix, name, hf_cache_pvc, hf_token_secret, model_image, image_platforms, explain)
    if not explain:
        asked = ", ".join(f"{k} {v}" for part in requests.values() for k, v in part.items())
        header += _wrap(
            f"Resources: {asked}. Why each field is what it is (the figures' sources, security, grace "
            f"period, /dev/shm, caches): `python build.py k8s {name} --explain`, docs/kubernetes.md."
        )
    else:
        header += _wrap(compile_cache_note(matrix, name, compile_cache_pvc))
        header += _wrap(requests_note)
    if strategy == "multi_node_tp" and not explain:
        header += _wrap(f"multi_node_tp: a LeaderWorkerSet of {nodes} pods per replica (LWS {LWS_VERSION}+ installed).")
    if strategy == "multi_node_tp" and explain:
        header += _wrap(
            f"multi_node_tp over {nodes} nodes: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, LWS "
            f"{LWS_VERSION}+ installed) of {nodes} pods per replica; LWS gives each pod LWS_LEADER_ADDRESS, "
            "LWS_GROUP_SIZE and LWS_WORKER_INDEX, from which the entrypoint composes vLLM's multi-node "
            "flags (docs/run.md). The Service reaches the leaders; the workers run headless."
        )
    extra = []
    if autoscale:
        extra.append(scaled_object(app, every_pod, deployment, autoscale, matrix.project.model, prometheus))
    if autoscale and not explain:
        header += _wrap(
            f"Autoscaling: {autoscale[0]} to {autoscale[1]} replicas "
            f"(KEDA {KEDA_VERSION}+, Prometheus at {prometheus})."
        )
    if autoscale and explain:
        header += _wrap(
            f"Autoscaling: KEDA {KEDA_VERSION}+ (keda.sh/v1alpha1) and a Prometheus at {prometheus} scraping the "
            f"pods (prometheus.io/* annotations): {autoscale[0]} to {autoscale[1]} replicas on "
            f"vllm:num_requests_waiting, {WAITING_THRESHOLD} per replica ({WAITING_WHY})."
        )
    if max(replicas, autoscale[1] if autoscale else 0) > 1:
        extra.append(disruption_budget(app, every_pod))
    return header + "---\n".join(dump(doc) for doc in [deployment, service, *extra])


def compile_cache_note(matrix: Matrix, name: str, compile_pvc: str | None) -> str:
    cache = _family(matrix, name).kubernetes.compile_cache
    what = f"vLLM's caches (VLLM_CACHE_ROOT={COMPILE_CACHE})" + (f" and {cache.why}" if cache.why else "")
    if _seeded(matrix, name, compile_pvc):
        where = (
            f"the pod's own emptyDir, which init container seed-compile-cache first fills from "
            f"PersistentVolumeClaim {compile_pvc} (read-only at {COMPILE_CACHE_SEED}: this family reads its "
            f"cache from local disk only). Fill the claim once from a pod that has warmed up (its {COMPILE_CACHE})"
        )
    elif compile_pvc:
        where = (
            f"PersistentVolumeClaim {compile_pvc} (ReadWriteMany for more than one pod): the first pod "
            "compiles, every later one starts warm"
        )
    else:
        where = (
            "an emptyDir: warm for a restarted container of the same pod only (--compile-cache-pvc shares it "
            "across pods)"
        )
    return f"Compile cache: {what} on {where}."


def _wrap(note: str) -> str:
    return "".join(line + "\n" for line in textwrap.wrap(note, 98, initial_indent="# ", subsequent_indent="#   "))


SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics"}
# Where KEDA asks Prometheus: the Prometheus Operator's service in namespace monitoring by default.
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
KEDA_VERSION = "v2.20.2"  # the release whose ScaledObject CRD tests/unit/test_k8s.py validates against
WAITING_THRESHOLD = 5
WAITING_WHY = (
    "vLLM's production-stack scales on this metric with KEDA at 5; requests wait only when every "
    "--max-num-seqs slot of the replica is busy (measured: tests/integration/test_autoscale_signal.py, "
    "16 requests at --max-num-seqs 2: waiting 14, running 2, both 0 after), so 5 waiting means a "
    "full batch and a queue behind it"
)


def scaled_object(app: str, labels: dict, target: dict, bounds: tuple[int, int], model: str, prometheus: str) -> dict:
    """KEDA rather than an autoscaling/v2 HPA on its own: an HPA reads a Prometheus metric only
    through a metrics adapter configured to rename it (vLLM's names hold colons, which the custom
    metrics API does not take); KEDA queries Prometheus itself and makes the HPA."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": target["apiVersion"],
                "kind": target["kind"],
                "name": target["metadata"]["name"],
            },
            "minReplicaCount": bounds[0],
            "maxReplicaCount": bounds[1],
            "pollingInterval": 15,
            # A replica takes minutes to start: scale in slowly.
            "cooldownPeriod": 300,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus,
                        # vLLM labels its metrics with the served model's name.
                        "query": f'sum(vllm:num_requests_waiting{{model_name="{model}"}})',
                        "threshold": str(WAITING_THRESHOLD),
                    },
                }
            ],
        },
    }


def disruption_budget(app: str, labels: dict) -> dict:
    """A voluntary eviction (a node drain) takes one of the pods at a time: the others keep serving."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }


# LeaderWorkerSet: the pods of one group are created, and restarted, together (a node lost is a
# tensor-parallel group lost). LWS v0.10.0's API (kubernetes-sigs/lws api/leaderworkerset/v1): the
# schema tests/unit/test_k8s.py validates against is that release's CRD.
LWS_VERSION = "v0.10.0"
LWS_ROLE = "gemma4-images/role"


def lws_set(metadata: dict, template_meta: dict, replicas: int, nodes: int, pod: dict) -> dict:
    """A LeaderWorkerSet of groups of nodes pods: the leader runs pod as the Deployment would (the
    API, its probes), the workers the same container headless: no port, no HTTP probes."""
    strategy = {"name": "GEMMA4_STRATEGY", "value": "multi_node_tp"}
    leader = {**pod, "containers": [{**pod["containers"][0], "env": [*pod["containers"][0]["env"], strategy]}]}
    worker_container = {
        k: v
        for k, v in leader["containers"][0].items()
        if k not in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle")
    }
    worker = {**pod, "containers": [worker_container]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {**metadata, "labels": {k: v for k, v in metadata["labels"].items() if k != LWS_ROLE}},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": template_meta, "spec": leader},
                # No annotations: a worker serves no /metrics.
                "workerTemplate": {
                    "metadata": {"labels": {**template_meta["labels"], LWS_ROLE: "worker"}},
                    "spec": worker,
                },
            },
        },
    }


def _shm_reason(matrix: Matrix, name: str) -> str:
    given = matrix.targets[name].run.shm_size
    if given:
        return f"the recipe's --shm-size {given}"
    host_ipc = "the recipe's --ipc=host is not given to pods"
    if matrix.families[matrix.targets[name].family].accelerator == "none":
        return f"{host_ipc}; what the CPU smoke tier needs, 1Gi at least"
    return f"{host_ipc}; as large as the recipes that size it"
