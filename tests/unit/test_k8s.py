"""Kubernetes manifests per target, validated against the Kubernetes API's own schemas (shipped
offline by the kubernetes-validate package, strict: unknown fields fail), and their readiness
probe run for real against a local HTTP server."""

import http.server
import json
import os
import threading

import kubernetes_validate
import pytest
import yaml

from gemma4_images.check import running
from gemma4_images.generate import k8s
from gemma4_images.publish import publish
from gemma4_images.spec import matrix
from gemma4_images.spec import measured as spec_measured
from gemma4_images.spec.image_code import gemma4_serve
from tests.cli import build_py

M = matrix.load()
TARGETS = list(M.targets)
# The oldest Kubernetes still commonly run, and the newest the package knows.
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def docs(target, **kw):
    return list(yaml.safe_load_all(k8s.render_k8s(M, target, **kw)))


def pod(target, **kw):
    return docs(target, **kw)[0]["spec"]["template"]["spec"]


def container(target, **kw):
    return pod(target, **kw)["containers"][0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_manifests_validate_against_the_kubernetes_schema(target, version):
    rendered = docs(target, replicas=3, image="127.0.0.1:5000/gemma4-e2b:x", digest="sha256:" + "a" * 64)
    # more than one replica: a disruption budget too
    assert [d["kind"] for d in rendered] == ["Deployment", "Service", "PodDisruptionBudget"]
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_what_a_cluster_would():
    deployment = docs("xeon6")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshhold"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    deployment = docs("xeon6")[0]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    "target, resource, count",
    [
        ("gaudi2", "habana.ai/gaudi", 1),
        ("h100", "nvidia.com/gpu", 1),
        ("b300", "nvidia.com/gpu", 1),
        ("mi300x", "amd.com/gpu", 1),
        ("mi355x", "amd.com/gpu", 1),
        ("trillium", "google.com/tpu", 1),
        ("ironwood", "google.com/tpu", 4),
        ("xeon6", None, 0),
    ],
)
def test_device_resource(target, resource, count):
    limits = container(target).get("resources", {}).get("limits", {})
    assert limits == ({resource: count} if resource else {})


def test_the_pod_and_docker_run_come_from_the_same_run_fields():
    # gaudi2: -e HABANA_VISIBLE_DEVICES=all is docker's; the device plugin sets it per pod.
    assert "-e HABANA_VISIBLE_DEVICES=all" in " ".join(running.docker_flags(M.targets["gaudi2"].run))
    assert running.sdk_kwargs(M.targets["gaudi2"].run)["environment"]["HABANA_VISIBLE_DEVICES"] == "all"
    assert container("gaudi2")["securityContext"] == {"capabilities": {"add": ["SYS_NICE"]}}
    kw = running.sdk_kwargs(M.targets["mi300x"].run)
    assert kw["devices"] == ["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"] and kw["shm_size"] == "16G"
    assert kw["cap_add"] == ["CAP_SYS_ADMIN", "SYS_PTRACE"] and kw["privileged"] is True
    assert [r.capabilities for r in running.sdk_kwargs(M.targets["h100"].run)["device_requests"]] == [[["gpu"]]]
    assert pod("ironwood")["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x1"


@pytest.mark.parametrize(
    "target, size",
    [
        ("mi300x", "16Gi"),
        ("trillium", "16Gi"),  # the recipes' --shm-size 16G
        ("gaudi2", "16Gi"),
        ("h100", "16Gi"),  # --ipc=host: sized like the recipes that size it
        ("xeon6", "1Gi"),  # the CPU smoke tier's measured 1g
    ],
)
def test_dev_shm_is_memory_sized_as_the_recipe_needs(target, size):
    spec = pod(target)
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert not spec.get("hostIPC"), "--ipc=host is not given to pods"


def test_docker_sizes_become_binary_quantities():
    assert [k8s.quantity(s) for s in ("16G", "1g", "512m", "64k", "100")] == ["16Gi", "1Gi", "512Mi", "64Ki", "100"]


@pytest.mark.parametrize("target", TARGETS)
def test_probes(target):
    c = container(target)
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    # Liveness waits for the whole warm-up budget of targets.yaml, and not much longer.
    budget = M.targets[target].startup_budget_s
    assert budget <= startup["periodSeconds"] * startup["failureThreshold"] < budget + startup["periodSeconds"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["exec"]["command"] == ["gemma4-serve", "--ready"]  # the image's own check


class FakeServer(http.server.BaseHTTPRequestHandler):
    health = 200
    models = ["google/gemma-4-E2B-it"]

    def do_GET(self):
        if self.path == "/health":
            status, body = self.health, b""
        elif self.path == "/v1/models":
            status, body = 200, json.dumps({"data": [{"id": m} for m in self.models]}).encode()
        else:
            status, body = 404, b""
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.mark.parametrize(
    "health, models, ready",
    [
        (200, ["google/gemma-4-E2B-it"], True),
        (200, ["google/gemma-4-E2B-it", "other"], True),
        (200, [], False),  # up, model not loaded under that name
        (503, ["google/gemma-4-E2B-it"], False),  # listed, but the engine is unhealthy
    ],
)
def test_readiness_checks_health_then_the_model(fake_server, tmp_path, monkeypatch, health, models, ready):
    # What the probe runs (gemma4-serve --ready), on the port the entrypoint recorded at start.
    monkeypatch.setattr(FakeServer, "health", health)
    monkeypatch.setattr(FakeServer, "models", models)
    (tmp_path / "port").write_text(str(fake_server.server_port))
    monkeypatch.setattr(gemma4_serve, "PORT_FILE", str(tmp_path / "port"))
    monkeypatch.setattr(gemma4_serve, "SERVED_FILE", str(tmp_path / "served"))
    assert (gemma4_serve.ready(M.recipe("h100")) == 0) == ready


def test_readiness_is_not_ready_when_nothing_listens(tmp_path, monkeypatch):
    (tmp_path / "port").write_text("1")
    monkeypatch.setattr(gemma4_serve, "PORT_FILE", str(tmp_path / "port"))
    assert gemma4_serve.ready(M.recipe("h100")) != 0


@pytest.mark.parametrize("target", TARGETS)
def test_grace_period_and_a_read_only_root_where_measured(target):
    spec = pod(target)
    assert spec["terminationGracePeriodSeconds"] == M.targets[target].shutdown_grace_s
    read_only = spec["containers"][0]["securityContext"].get("readOnlyRootFilesystem", False)
    assert read_only == (M.families[M.targets[target].family].accelerator == "none")
    tmp = [v for v in spec["volumes"] if v["name"] == "tmp"]
    assert tmp == ([{"name": "tmp", "emptyDir": {}}] if read_only else [])


def test_hf_cache_on_a_named_claim_and_token_from_an_optional_secret():
    spec = pod("h100", hf_cache_pvc="models-cache", hf_token_secret="hub")
    cache = next(v for v in spec["volumes"] if v["name"] == "hf-cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "models-cache"}
    c = spec["containers"][0]
    assert {"name": "hf-cache", "mountPath": k8s.HF_HOME} in c["volumeMounts"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HOME"]["value"] == k8s.HF_HOME
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token", "optional": True}},
    }
    no_claim = pod("h100", hf_cache_pvc=None)
    assert next(v for v in no_claim["volumes"] if v["name"] == "hf-cache") == {"name": "hf-cache", "emptyDir": {}}


def test_env_from_targets_yaml_without_the_docker_only_device_setting():
    env = {e["name"]: e.get("value") for e in container("gaudi2")["env"]}
    for key, value in M.families["gaudi"].env.items():
        assert env[key] == value
    assert "HABANA_VISIBLE_DEVICES" not in env


def test_image_by_digest_when_known(tmp_path):
    digest = "sha256:" + "b" * 64
    assert container("h100")["image"] == M.tag("h100")
    assert (
        container("h100", image="reg.example/ns/gemma4-e2b:h100-v0.30.0", digest=digest)["image"]
        == f"reg.example/ns/gemma4-e2b:h100-v0.30.0@{digest}"
    )
    publish.record(
        [
            {
                "target": "h100",
                "repository": "127.0.0.1:5000/ns/gemma4-e2b",
                "digest": digest,
                "tags": [],
                "image": "x",
                "image_id": "y",
            }
        ],
        tmp_path / publish.PUSHED_FILE,
    )
    ref = publish.pushed_ref("h100", tmp_path)
    assert ref == f"127.0.0.1:5000/ns/gemma4-e2b@{digest}"
    assert container("h100", image=ref)["image"] == ref
    assert publish.pushed_ref("b200", tmp_path) is None


def test_cpu_runs_as_non_root_without_privileges():
    spec = pod("xeon6")
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 2000
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


@pytest.mark.parametrize("target", ["mi300x", "trillium"])
def test_rocm_and_tpu_keep_the_privilege_their_recipes_run_with(target):
    assert container(target)["securityContext"] == {"privileged": True}
    assert "privileged" in k8s.render_k8s(M, target).split("apiVersion")[0], "the reason is in the manifest"


def test_cuda_and_gaudi_are_not_privileged():
    assert not container("h100")["securityContext"].get("privileged")
    assert container("gaudi2")["securityContext"] == {"capabilities": {"add": ["SYS_NICE"]}}


def test_tpu_node_selector():
    assert pod("trillium")["nodeSelector"] == {
        "kubernetes.io/arch": "amd64",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "1x1",
    }


def test_the_node_architecture_is_selected_only_for_a_single_platform_image():
    # h100 and xeon6 are published for linux/amd64 and linux/arm64: any node; the others amd64 only.
    assert "nodeSelector" not in pod("h100") and "nodeSelector" not in pod("xeon6")
    assert pod("gaudi2")["nodeSelector"] == pod("mi300x")["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


def test_service_selects_the_pods_and_replicas_apply():
    deployment, service, _ = docs("mi300x", replicas=4)
    assert deployment["spec"]["replicas"] == 4
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    # No spare accelerator is needed to roll out a new version.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_no_service_links_into_vllm_env():
    assert pod("h100")["enableServiceLinks"] is False


def test_aliases_and_unknown_targets():
    def run(*args):
        return build_py("k8s", *args)

    assert run("cpu").stdout == run("xeon6").stdout != ""
    r = run("h800")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown target 'h800'")


def _pushed(folder, **entry):
    base = {"target": "xeon6", "repository": "127.0.0.1:5000/ns/gemma4-e2b", "tags": [], "image": "x"}
    publish.record([{**base, **entry}], folder / "reports" / publish.PUSHED_FILE)


def _cli_pod(folder):
    done = build_py("k8s", "xeon6", "--explain", env={**os.environ, "GEMMA4_REPORTS": str(folder / "reports")})
    assert done.returncode == 0, done.stderr
    return next(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"], done.stdout.split("apiVersion")[0]


@pytest.mark.parametrize("pushed, arch", [(["linux/amd64"], "amd64"), (["linux/arm64"], "arm64"), ([], None)])
def test_the_nodes_are_those_of_the_platforms_actually_pushed(tmp_path, pushed, arch):
    # targets.yaml lists both platforms for xeon6; a release that pushed one of them must not let
    # the scheduler place a pod on a node of the other (it would fail to pull, or exec the wrong
    # binaries). [] is an index of both.
    digest = "sha256:" + "c" * 64
    if pushed:
        _pushed(tmp_path, digest=digest, platform=pushed[0])
    else:
        parts = [{"platform": p, "digest": "sha256:" + n * 64} for p, n in (("linux/amd64", "a"), ("linux/arm64", "b"))]
        _pushed(tmp_path, digest=digest, platforms=parts)
    spec, header = _cli_pod(tmp_path)
    assert spec["containers"][0]["image"] == f"127.0.0.1:5000/ns/gemma4-e2b@{digest}"
    if arch:
        assert spec["nodeSelector"] == {"kubernetes.io/arch": arch}
        assert f"Image platforms: {pushed[0]} (nodes of that architecture only)." in header
    else:
        assert "nodeSelector" not in spec
        assert "Image platforms: linux/amd64, linux/arm64 (any of those nodes)." in header


def test_a_push_recorded_before_platforms_were_is_amd64s(tmp_path):
    _pushed(tmp_path, digest="sha256:" + "d" * 64)  # no "platform": only linux/amd64 was pushed then
    assert _cli_pod(tmp_path)[0]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


# -- multi_node_tp: a LeaderWorkerSet --------------------------------------------------------------
LWS_SCHEMA = matrix.ROOT / "tests" / "data" / "crds" / "leaderworkerset.x-k8s.io-v1-lws-v0.10.0.schema.json.gz"
MULTI_NODE = [n for n, t in M.targets.items() if "multi_node_tp" not in t.serve.unsupported_strategies]


def strict(schema):
    """The CRD's schema with unknown fields refused, as strict field validation does."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def validate_lws(doc):
    validate_crd(doc, LWS_SCHEMA)


def test_multi_node_targets_are_the_ones_whose_recipes_allow_it():
    assert sorted(MULTI_NODE) == sorted(n for n in M.targets if M.targets[n].family in ("cuda", "rocm", "cpu"))


@pytest.mark.parametrize("target", MULTI_NODE)
def test_multi_node_renders_a_leaderworkerset_valid_against_its_crd_and_kubernetes(target):
    lws, service, budget = docs(target, replicas=2, strategy="multi_node_tp", nodes=4)
    kubernetes_validate.validate(budget, VERSIONS[-1], strict=True)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["replicas"] == 2
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    validate_lws(lws)
    for role in ("leaderTemplate", "workerTemplate"):
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": group[role]}
        kubernetes_validate.validate(template, VERSIONS[-1], strict=True)
    kubernetes_validate.validate(service, VERSIONS[-1], strict=True)
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    # The Service reaches the leaders only; they serve the API with the Deployment's probes.
    assert service["spec"]["selector"] == leader["metadata"]["labels"] != worker["metadata"]["labels"]
    (lc,), (wc,) = leader["spec"]["containers"], worker["spec"]["containers"]
    assert {"name": "GEMMA4_STRATEGY", "value": "multi_node_tp"} in lc["env"] and lc["env"] == wc["env"]
    assert "readinessProbe" in lc and "ports" in lc
    assert not {"readinessProbe", "livenessProbe", "startupProbe", "ports"} & set(wc)
    assert lc["image"] == wc["image"] and lc.get("resources") == wc.get("resources")


def test_the_lws_schema_refuses_what_the_api_server_would():
    lws = docs("h100", strategy="multi_node_tp", nodes=2)[0]
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    with pytest.raises(Exception, match="sise"):
        validate_lws(lws)
    lws = docs("h100", strategy="multi_node_tp", nodes=2)[0]
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(Exception, match="Always"):
        validate_lws(lws)


@pytest.mark.parametrize(
    "args, says",
    [
        (["cpu", "--strategy", "multi_node_tp", "--nodes", "1"], "--nodes 1: multi_node_tp spans 2 nodes or more"),
        (["cpu", "--strategy", "multi_node_tp"], "multi_node_tp needs --nodes N, the nodes it spans (N >= 2)"),
        (["gaudi2", "--strategy", "multi_node_tp", "--nodes", "2"], "is not available on gaudi2"),
        (["ironwood", "--strategy", "multi_node_tp", "--nodes", "2"], "is not available on ironwood"),
    ],
)
def test_bad_multi_node_input_is_one_line_and_prints_no_manifest(args, says):
    r = build_py("k8s", *args)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr


# -- autoscaling, disruption budget, metrics ---------------------------------------------------------
KEDA_SCHEMA = matrix.ROOT / "tests" / "data" / "crds" / "keda.sh-v1alpha1-scaledobjects-keda-v2.20.2.schema.json.gz"


def validate_crd(doc, path):
    import gzip

    import jsonschema

    jsonschema.validate(doc, strict(json.loads(gzip.decompress(path.read_bytes()))))


@pytest.mark.parametrize("target", TARGETS)
def test_autoscale_renders_a_keda_scaledobject_on_waiting_requests_and_a_budget(target):
    rendered = docs(target, autoscale=(2, 5))
    assert [d["kind"] for d in rendered] == ["Deployment", "Service", "ScaledObject", "PodDisruptionBudget"]
    deployment, service, scaled, budget = rendered
    validate_crd(scaled, KEDA_SCHEMA)
    for doc in (deployment, service, budget):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    assert deployment["spec"]["replicas"] == 2  # KEDA's MIN from the start
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 5)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "5"
    assert trigger["metadata"]["query"] == 'sum(vllm:num_requests_waiting{model_name="google/gemma-4-E2B-it"})'
    assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/path": "/metrics",
        "prometheus.io/port": "8000",
    }


def test_a_multi_node_set_is_what_keda_scales():
    scaled = docs("h100", strategy="multi_node_tp", nodes=2, autoscale=(1, 3))[2]
    validate_crd(scaled, KEDA_SCHEMA)
    assert scaled["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"


def test_the_keda_schema_refuses_what_the_api_server_would():
    scaled = docs("xeon6", autoscale=(1, 2))[2]
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(Exception, match="minReplicas"):
        validate_crd(scaled, KEDA_SCHEMA)


def test_one_replica_has_no_budget():
    assert [d["kind"] for d in docs("xeon6")] == ["Deployment", "Service"]


@pytest.mark.parametrize(
    "value, says",
    [("3:1", "MIN is more than MAX"), ("0:2", "MIN must be 1 or more"), ("2", "give MIN:MAX"), ("a:b", "give MIN:MAX")],
)
def test_bad_autoscale_is_one_line_and_prints_no_manifest(value, says):
    r = build_py("k8s", "cpu", "--autoscale", value)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["--replicas", "-1"], "--replicas -1: give 0 to 2147483647"),
        (["--replicas", "2147483648"], "--replicas 2147483648: give 0 to 2147483647"),
        (["--autoscale", "1:99999999999"], "--autoscale MAX 99999999999: give 0 to 2147483647"),
        (["--pvc", "HF_Cache"], "--pvc 'HF_Cache' is not a Kubernetes object name"),
        (["--secret", "hf-token."], "--secret 'hf-token.' is not a Kubernetes object name"),
        (["--secret", "a" * 254], f"--secret '{'a' * 254}' is not a Kubernetes object name"),
        (["--compile-cache-pvc", "cache claim"], "--compile-cache-pvc 'cache claim' is not a Kubernetes object name"),
        (
            ["--model-image", "127.0.0.1:5000/models/tiny:1", "--model-name", "../etc"],
            "--model-name '../etc' is not usable as a folder",
        ),
        (["--prometheus", "prometheus:9090"], "--prometheus 'prometheus:9090' is not an http(s) URL"),
        (["--prometheus", "http://:9090"], "--prometheus 'http://:9090' is not an http(s) URL"),
        (["--prometheus", "http://p:99999"], "--prometheus 'http://p:99999' is not an http(s) URL"),
    ],
)
def test_values_a_cluster_would_reject_are_one_line_and_print_no_manifest(args, says):
    r = build_py("k8s", "cpu", *args)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {says}"), r.stderr


def test_the_largest_values_a_cluster_takes_still_render():
    args = ["--autoscale", f"1:{2**31 - 1}", "--pvc", "a" * 253, "--prometheus", "https://p.example:9443/prom"]
    assert build_py("k8s", "cpu", *args).returncode == 0


@pytest.mark.parametrize("target", TARGETS)
def test_the_prestop_delay_leaves_vllm_its_shutdown_within_the_grace_period(target):
    spec = pod(target)
    (c,) = spec["containers"]
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": k8s.PRESTOP_S}}}
    # vLLM's shutdown with requests in flight took 1-3 s on the CPU tier (GRACE_WHY): 10 s of margin.
    assert spec["terminationGracePeriodSeconds"] >= k8s.PRESTOP_S + 10


def test_vllms_compile_caches_live_on_their_own_volume():
    spec = pod("xeon6")
    (c,) = spec["containers"]
    assert {"name": "VLLM_CACHE_ROOT", "value": k8s.COMPILE_CACHE} in c["env"]
    assert {"name": "compile-cache", "mountPath": k8s.COMPILE_CACHE} in c["volumeMounts"]
    assert {"name": "compile-cache", "emptyDir": {}} in spec["volumes"]  # per pod unless a claim is given
    shared = pod("h100", compile_cache_pvc="vllm-compile")
    assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": "vllm-compile"}} in shared["volumes"]
    out = build_py("k8s", "cpu", "--compile-cache-pvc", "vllm-compile", "--explain").stdout
    assert "claimName: vllm-compile" in out and "every later one starts warm" in out.replace("\n#   ", " ")


def test_every_cache_the_family_compiles_into_is_on_the_volume():
    # tpu-inference hands JAX VLLM_XLA_CACHE_PATH, whose default is not under VLLM_CACHE_ROOT.
    env = {e["name"]: e.get("value") for e in container("trillium")["env"]}
    assert env["VLLM_XLA_CACHE_PATH"] == f"{k8s.COMPILE_CACHE}/xla_cache"
    env = {e["name"]: e.get("value") for e in container("gaudi2")["env"]}
    path, delete, size = env["PT_HPU_RECIPE_CACHE_CONFIG"].split(",")
    assert path.startswith(k8s.COMPILE_CACHE + "/") and delete == "false" and int(size) > 0
    # The other families compile into VLLM_CACHE_ROOT only.
    for target in ("h100", "mi300x", "xeon6"):
        names = {e["name"] for e in container(target)["env"]}
        assert not names & {"VLLM_XLA_CACHE_PATH", "PT_HPU_RECIPE_CACHE_CONFIG"}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_shared_claim_seeds_gaudis_local_cache_and_is_used_in_place_elsewhere(version):
    rendered = docs("gaudi2", compile_cache_pvc="warm")
    spec = rendered[0]["spec"]["template"]["spec"]
    kubernetes_validate.validate(rendered[0], version, strict=True)
    (init,) = spec["initContainers"]
    assert init["image"] == spec["containers"][0]["image"]
    assert init["command"] == ["cp", "-a", f"{k8s.COMPILE_CACHE_SEED}/.", f"{k8s.COMPILE_CACHE}/"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["compile-cache"] == {"name": "compile-cache", "emptyDir": {}}  # local disk
    assert volumes["compile-cache-seed"]["persistentVolumeClaim"] == {"claimName": "warm", "readOnly": True}
    # Without a claim, or for a family that may use it in place, no seeding.
    assert "initContainers" not in pod("gaudi2") and "initContainers" not in pod("h100", compile_cache_pvc="warm")


def test_the_seed_copy_fills_the_pods_volume_with_the_claims_tree(tmp_path):
    # The init container's own command, run here on a copy of what a warm claim holds.
    import subprocess

    command = docs("gaudi2", compile_cache_pvc="warm")[0]["spec"]["template"]["spec"]["initContainers"][0]["command"]
    seed, local = tmp_path / "seed", tmp_path / "local"
    (seed / "hpu-recipes").mkdir(parents=True)
    (seed / "hpu-recipes" / "r1").write_bytes(b"recipe")
    (seed / ".hidden").write_text("x")
    local.mkdir()
    # The pod's mount points, here: the seed claim first (the cache path is a prefix of it).
    here = [
        a.replace(k8s.COMPILE_CACHE_SEED, str(seed)) if a.startswith(k8s.COMPILE_CACHE_SEED) else a for a in command
    ]
    subprocess.run([a.replace(k8s.COMPILE_CACHE, str(local)) for a in here], check=True)
    assert (local / "hpu-recipes" / "r1").read_bytes() == b"recipe" and (local / ".hidden").exists()


# Figures as bench/pod.py records them (bytes), fixed here so the sums below are known.
POD_MEMORY = {"server": 1.8 * 2**30, "per_kv_gib": 1.0 * 2**30}


@pytest.fixture
def measured(monkeypatch):
    monkeypatch.setattr(spec_measured, "pod_memory", lambda: POD_MEMORY)
    monkeypatch.setattr(spec_measured, "fullsize_memory", lambda: None)


def test_memory_requests_add_the_measured_server_the_checkpoint_and_a_host_kv_cache(measured):
    # xeon6: 1.8 GiB + 10.2 GB (9.5 GiB) + 4 GiB of KV cache = 15.3 GiB
    cpu = container("xeon6")
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"} in cpu["env"]
    assert cpu["resources"] == {"requests": {"cpu": "8", "memory": "16Gi"}}
    # On a device the weights and the KV cache live there: 1.8 GiB + 9.5 GiB = 11.3 GiB.
    for target in ("h100", "gaudi2", "trillium"):
        c = container(target)
        assert c["resources"]["requests"]["memory"] == "12Gi"
        assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in c["env"]}
    # One core per busy vLLM process: 4 chips are 4 workers besides the API server and engine core.
    assert container("h100")["resources"]["requests"]["cpu"] == "2"
    assert container("ironwood")["resources"]["requests"]["cpu"] == "6"


def test_the_cpu_request_is_e2b_shapes_working_set_once_measured(measured, monkeypatch):
    """bench/fullsize.py's working set of E2B's shape, at the KV cache it ran with, replaces the tiny
    server + checkpoint sum for the family whose host holds the model; accelerators keep the sum."""
    full = {"working_set": 17.3 * 2**30, "kv_cache_gib": 4}
    monkeypatch.setattr(spec_measured, "fullsize_memory", lambda: full)
    assert container("xeon6")["resources"]["requests"]["memory"] == "18Gi"
    text = k8s.render_k8s(M, "xeon6", explain=True).replace("\n#   ", " ")
    assert "random weights of E2B's shape" in text and "not measured here" not in text
    assert container("h100")["resources"]["requests"]["memory"] == "12Gi"
    # Measured at another KV size: each GiB of difference at the measured per-GiB cost.
    monkeypatch.setattr(spec_measured, "fullsize_memory", lambda: {**full, "kv_cache_gib": 2})
    assert container("xeon6")["resources"]["requests"]["memory"] == "20Gi"


@pytest.mark.parametrize(
    "serving, says",
    [
        ({"starts": [], "kv_cache_gib": 4}, "fullsize.serving lacks its working set"),
        ({"starts": [{"idle": 2**34, "loaded": True}], "kv_cache_gib": 4}, "is true, not a number of bytes"),
        ({"starts": [{"idle": 2**34, "loaded": 1e30}], "kv_cache_gib": 4}, "is 1e+30 bytes: give"),
        ({"starts": [{"idle": 2**34, "loaded": 2**34}], "kv_cache_gib": "4"}, 'kv_cache_gib is "4"'),
    ],
)
def test_absurd_fullsize_figures_are_one_line_naming_the_file_and_the_field(tmp_path, monkeypatch, serving, says):
    results = tmp_path / "benchmarks.json"
    results.write_text(json.dumps({"pod": {"memory": POD_MEMORY}, "fullsize": {"serving": serving}}))
    monkeypatch.setattr(spec_measured, "RESULTS", results)
    with pytest.raises(matrix.MatrixError) as e:
        k8s.render_k8s(M, "xeon6")
    assert str(e.value).startswith(f"{results}: ") and says in str(e.value) and "\n" not in str(e.value)


def test_the_committed_figures_are_a_servers():
    measured = spec_measured.pod_memory()
    assert 0.5 * 2**30 < measured["server"] < 8 * 2**30  # a server, not a model: see BENCHMARKS.md
    assert 1.0 <= measured["per_kv_gib"] / 2**30 < 1.5  # a GiB of KV cache costs at least a GiB (bench/pod.py)


def test_the_header_says_where_each_request_comes_from():
    text = k8s.render_k8s(M, "xeon6", explain=True).replace("\n#   ", " ")
    assert "E2B's shape" in text and 'measured, BENCHMARKS.md "E2B at its real size"' in text
    assert "VLLM_CPU_KVCACHE_SPACE=4" in text
    text = k8s.render_k8s(M, "h100", explain=True).replace("\n#   ", " ")
    assert "measured, BENCHMARKS.md" in text and "checkpoint 10.2 GB" in text


@pytest.mark.parametrize(
    "content",
    [
        None,
        "not json",
        '{"pod": []}',
        '{"pod": {"memory": {"server": 1}}}',
        '{"pod": {"memory": {"server": "1", "per_kv_gib": 1}}}',
    ],
)
def test_without_pod_figures_k8s_says_to_run_the_bench(tmp_path, monkeypatch, content):
    results = tmp_path / "benchmarks.json"
    if content is not None:
        results.write_text(content)
    monkeypatch.setattr(spec_measured, "RESULTS", results)
    with pytest.raises(matrix.MatrixError, match="make bench"):
        k8s.render_k8s(M, "xeon6")


@pytest.mark.parametrize(
    "memory, says",
    [
        ({"server": 2**31, "per_kv_gib": True}, "pod.memory.per_kv_gib is true, not a number of bytes"),
        ({"server": True, "per_kv_gib": 2**30}, "pod.memory.server is true, not a number of bytes"),
        ({"server": 1e30, "per_kv_gib": 2**30}, "pod.memory.server is 1e+30 bytes: give"),
        ({"server": float("nan"), "per_kv_gib": 2**30}, "pod.memory.server is nan bytes: give"),
        ({"server": 2**31, "per_kv_gib": float("inf")}, "pod.memory.per_kv_gib is inf bytes: give"),
        ({"server": -1, "per_kv_gib": 2**30}, "pod.memory.server is -1 bytes: give"),
        ({"server": 2**31, "per_kv_gib": 2**29}, "pod.memory.per_kv_gib is 536870912 bytes: give"),
    ],
)
def test_absurd_pod_figures_are_one_line_naming_the_file_and_the_field(tmp_path, monkeypatch, memory, says):
    results = tmp_path / "benchmarks.json"
    results.write_text(json.dumps({"pod": {"memory": memory}}))
    monkeypatch.setattr(spec_measured, "RESULTS", results)
    with pytest.raises(matrix.MatrixError) as e:
        k8s.render_k8s(M, "xeon6")
    assert str(e.value).startswith(f"{results}: {says}") and "\n" not in str(e.value)
    assert "make bench" in str(e.value)


def test_the_deployment_page_quotes_the_figures_benchmarks_json_and_the_manifests_hold():
    # docs/kubernetes.md copies what `make bench` measured and what k8s renders from it: a new bench
    # run that moves a figure makes this fail until the page says the same.
    pod = json.loads(spec_measured.RESULTS.read_text())["pod"]
    mem, cache = pod["memory"], pod["compile_cache"]
    doc = spec_measured.RESULTS.parent / "docs" / "kubernetes.md"
    page = " ".join(doc.read_text().split())
    server = f"{mem['server'] / 2**30:.2f}"
    quoted = [
        f"grew {mem['slope'] / 2**30:.2f} GiB per GiB",
        f"**{server} GiB**",
        f"so xeon6 asks for **{container('xeon6')['resources']['requests']['memory']}**",
        f"**{spec_measured.fullsize_memory()['working_set'] / 2**30:.1f} GiB**",
        f"would be 16Gi ({server} + 9.5 + 4 GiB)",
        f"the accelerators ask for **{container('h100')['resources']['requests']['memory']}** ({server} + 9.5)",
        f"healthy in {cache['median']['none']:.1f} s with the caches in the container",
        f"{cache['median']['cold']:.1f} s on an empty volume",
        f"**{cache['median']['warm']:.1f} s** on the warm volume ({cache['warm_over_none']:.2f}x)",
        f"held {cache['cache_bytes'] / 2**20:.1f} MiB",
    ]
    assert [q for q in quoted if q not in page] == [], doc


def test_the_header_is_short_unless_asked_to_explain():
    short = k8s.render_k8s(M, "xeon6").split("apiVersion")[0].splitlines()
    assert len(short) <= 6 and "`python build.py k8s xeon6 --explain`" in " ".join(short)
    assert "Resources: cpu 8, memory " in short[-2]
    explained = k8s.render_k8s(M, "xeon6", explain=True).split("apiVersion")[0]
    assert "terminationGracePeriodSeconds" in explained and "terminationGracePeriodSeconds" not in "".join(short)
    # The manifests themselves are the same either way.
    assert (
        k8s.render_k8s(M, "xeon6").split("apiVersion", 1)[1]
        == k8s.render_k8s(M, "xeon6", explain=True).split("apiVersion", 1)[1]
    )
