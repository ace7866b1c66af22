"""Kubernetes manifests for one target: a Deployment and a Service that run the image the way its
recipe runs it, translated from `docker run` flags to what a cluster offers."""

from __future__ import annotations

import math
import re
import textwrap

import yaml

from .matrix import Matrix

DEVICE_RESOURCE = {
    "habana": "habana.ai/gaudi",
    "nvidia": "nvidia.com/gpu",
    "amd": "amd.com/gpu",
    "tpu": "google.com/tpu",
    "none": None,
}
# GKE labels its TPU nodes with the accelerator and topology; a pod lands on a TPU VM only through
# them. E2B fits one chip: the smallest single-host VM of each generation, whose chips the pod
# must request all of.
TPU_NODES = {"trillium": ("tpu-v6e-slice", "1x1", 1), "ironwood": ("tpu7x", "2x2x1", 4)}
# Not /root/.cache/huggingface as in `docker run`: /root is 0700 in the images, so a non-root pod
# cannot reach it (measured). One path for every target, named by HF_HOME.
HF_HOME = "/var/cache/huggingface"
NON_ROOT_UID = 2000  # the uid the CPU smoke tier runs as
HTTP = "http"
# Ready = /health answers and /v1/models lists the served model: the image's own check, on the
# port and model name the entrypoint recorded when it started the server.
READY_COMMAND = ["gemma4-serve", "--ready"]
# A writable /tmp for a read-only root: vLLM, torch.compile and HOME (set by the entrypoint for a
# uid without an account) write there. An emptyDir allows exec, which torch.compile needs.
TMP = "/tmp"
GRACE_WHY = (
    "on SIGTERM vLLM aborts what is in flight, ends each request with a 503 (shutdown-ends-requests) "
    "and exits 0: measured 1-3 s on the CPU tier during traffic, not yet on accelerators; raise it "
    "above --shutdown-timeout if you pass one"
)

# What each family's recipe needs from the kernel, and why; the reason is printed in the manifest.
SECURITY = {
    "none": (
        "non-root",
        "the CPU image serves as uid 2000 with no capabilities, no privilege and a "
        "read-only root filesystem, /tmp on an emptyDir (measured); the recipe's --privileged is not "
        "needed",
    ),
    "nvidia": (
        "root",
        "the recipe's --privileged exposes the GPUs to docker; here the NVIDIA device "
        "plugin does that. Root, and a writable root filesystem: the vendor image is untested as "
        "non-root and read-only (its CUDA, Triton and compile caches write under $HOME and /tmp)",
    ),
    "habana": (
        "root+SYS_NICE",
        "the Gaudi recipe adds SYS_NICE and is not privileged; the habana "
        "runtime must be the node's default (--runtime=habana has no pod field). A writable root "
        "filesystem: HPU graph and recipe caches are untested read-only",
    ),
    "amd": (
        "privileged",
        "the ROCm recipe runs privileged with SYS_ADMIN, SYS_PTRACE and seccomp "
        "unconfined; kept until a run under the AMD device plugin proves it can go",
    ),
    "tpu": (
        "privileged",
        "the TPU recipe runs privileged, and GKE before 1.28 needs it for TPU "
        "devices; kept until a TPU run proves it can go",
    ),
}


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


def _flag(flags: list[str], name: str) -> str | None:
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            return flags[i + 1]
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None


def shm_size(matrix: Matrix, name: str) -> str:
    """/dev/shm as the recipe sizes it. --ipc=host (the host's /dev/shm, unbounded) is not given to
    pods: it shares the node's IPC namespace with every such pod; a memory-backed emptyDir as large
    as the recipes that do size it (16G) stands in. CPU: what its smoke tier measured, 1Gi at least."""
    t = matrix.targets[name]
    given = _flag(t.run_flags, "--shm-size")
    if given:
        return quantity(given)
    if matrix.families[t.family].accelerator == "none":
        measured = quantity(t.smoke.shm_size or "1g")
        return measured if measured.endswith("Gi") and int(measured[:-2]) >= 1 else "1Gi"
    return "16Gi"


def _env(matrix: Matrix, name: str, secret: str) -> list[dict]:
    t = matrix.targets[name]
    env = dict(t.env)
    flags = t.run_flags
    for flag, value in zip(flags, flags[1:]):
        if flag == "-e" and "=" in value:
            key, value = value.split("=", 1)
            # The device plugin sets which Gaudi the pod gets; "all" would override it.
            if key != "HABANA_VISIBLE_DEVICES":
                env[key] = value
    out = [{"name": k, "value": v} for k, v in env.items()]
    out.append({"name": "HF_HOME", "value": HF_HOME})
    out.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token", "optional": True}}})
    return out


def _security(accelerator: str) -> tuple[dict, dict]:
    """(pod securityContext, container securityContext)."""
    mode = SECURITY[accelerator][0]
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
    ref = image or matrix.tag(name)
    return f"{ref}@{digest}" if digest and "@" not in ref else ref


def _container(matrix: Matrix, name: str, image: str, secret: str) -> dict:
    t = matrix.targets[name]
    accelerator = matrix.families[t.family].accelerator
    resource, port = DEVICE_RESOURCE[accelerator], matrix.project.port
    health = {"httpGet": {"path": "/health", "port": HTTP}}
    return {
        "name": "vllm",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": HTTP, "containerPort": port}],
        "env": _env(matrix, name, secret),
        **({"resources": {"limits": {resource: TPU_NODES.get(name, (None, None, 1))[2]}}} if resource else {}),
        "securityContext": _security(accelerator)[1],
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": HF_HOME},
            *([{"name": "tmp", "mountPath": TMP}] if read_only(accelerator) else []),
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
    }


def read_only(accelerator: str) -> bool:
    return bool(_security(accelerator)[1].get("readOnlyRootFilesystem"))


def _pod(matrix: Matrix, name: str, container: dict, pvc: str | None) -> dict:
    t = matrix.targets[name]
    accelerator = matrix.families[t.family].accelerator
    pod_sc = _security(accelerator)[0]
    cache = {"persistentVolumeClaim": {"claimName": pvc}} if pvc else {"emptyDir": {}}
    return {
        # SIGTERM ends the requests in flight with a 503 (shutdown-ends-requests) and vLLM exits;
        # this is how long that may take before the kubelet kills it.
        "terminationGracePeriodSeconds": t.shutdown_grace_s,
        # Kubernetes puts <SERVICE>_PORT=tcp://... in every pod's env; a Service named vllm would
        # set VLLM_PORT, which vLLM reads as its own setting and fails on.
        "enableServiceLinks": False,
        **({"securityContext": pod_sc} if pod_sc else {}),
        **(
            {
                "nodeSelector": {
                    "cloud.google.com/gke-tpu-accelerator": TPU_NODES[name][0],
                    "cloud.google.com/gke-tpu-topology": TPU_NODES[name][1],
                }
            }
            if name in TPU_NODES
            else {}
        ),
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(matrix, name)}},
            {"name": "hf-cache", **cache},
            *([{"name": "tmp", "emptyDir": {}}] if read_only(accelerator) else []),
        ],
    }


def _header(matrix: Matrix, name: str, pvc: str | None, secret: str) -> str:
    t = matrix.targets[name]
    accelerator = matrix.families[t.family].accelerator
    resource = DEVICE_RESOURCE[accelerator]
    needs = (
        ([f"the {resource} device plugin"] if resource else [])
        + ([f"PersistentVolumeClaim {pvc} (ReadWriteMany for more than one replica)"] if pvc else [])
        + [f"optionally Secret {secret} with key token (HF_TOKEN)"]
    )
    notes = [
        f"{matrix.project.image}-{name}: {matrix.project.model} on vLLM {matrix.project.vllm_version} ({t.hardware}).",
        "Generated by `python build.py k8s`. Needs: " + "; ".join(needs) + ".",
        f"securityContext: {SECURITY[accelerator][1]}.",
        f"terminationGracePeriodSeconds: {t.shutdown_grace_s} ({GRACE_WHY}).",
        f"/dev/shm: {shm_size(matrix, name)} in memory ({_shm_reason(matrix, name)}).",
    ]
    return "".join(
        line + "\n" for note in notes for line in textwrap.wrap(note, 98, initial_indent="# ", subsequent_indent="#   ")
    )


def render_k8s(
    matrix: Matrix,
    target: str,
    replicas: int = 1,
    image: str | None = None,
    digest: str | None = None,
    *,
    hf_cache_pvc: str | None = "gemma4-e2b-hf-cache",
    hf_token_secret: str = "hf-token",
) -> str:
    """Deployment + Service (multi-document YAML). image may already be repo@digest (from
    reports/pushed.json); hf_cache_pvc=None keeps the cache in the pod (an emptyDir)."""
    name = matrix.resolve(target)
    app = f"{matrix.project.image}-{name}"
    labels = {"app.kubernetes.io/name": matrix.project.image, "app.kubernetes.io/instance": app}
    on_device = DEVICE_RESOURCE[matrix.families[matrix.targets[name].family].accelerator] is not None
    container = _container(matrix, name, _image(matrix, name, image, digest), hf_token_secret)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {**labels, "app.kubernetes.io/version": matrix.tag(name).split(":")[1]}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            # An accelerator node rarely has a spare device for a surge pod: replace, don't add.
            **(
                {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}
                if on_device
                else {}
            ),
            "template": {"metadata": {"labels": labels}, "spec": _pod(matrix, name, container, hf_cache_pvc)},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": HTTP, "port": matrix.project.port, "targetPort": HTTP}]},
    }
    dump = lambda doc: yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=110)  # noqa: E731
    return _header(matrix, name, hf_cache_pvc, hf_token_secret) + dump(deployment) + "---\n" + dump(service)


def _shm_reason(matrix: Matrix, name: str) -> str:
    flags = matrix.targets[name].run_flags
    if _flag(flags, "--shm-size"):
        return f"the recipe's --shm-size {_flag(flags, '--shm-size')}"
    host_ipc = "the recipe's --ipc=host is not given to pods"
    if matrix.families[matrix.targets[name].family].accelerator == "none":
        return f"{host_ipc}; what the CPU smoke tier needs, 1Gi at least"
    return f"{host_ipc}; as large as the recipes that size it"
