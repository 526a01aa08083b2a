"""deploy/k8s stays valid and in step with the code, without a cluster.

Every YAML document parses; every file a kustomization names exists; the overlays'
patches land on resources of the base; every object of every build (base and each
overlay, built here the way kustomize would for these files) validates against the
Kubernetes API schemas of kubernetes-validate, offline; and the topology holds: a
Deployment per registered service, the shared env on every Temper container, three
NATS servers routed to each other.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from protocol.servers import server_list
from services import registry
from services.cli import build_parser
from services.runtime.settings import from_env, variables

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BUILDS = {
    "base": K8S / "base",
    **{path.parent.name: path.parent for path in sorted(K8S.glob("overlays/*/kustomization.yaml"))},
}
OVERLAYS = sorted(set(BUILDS) - {"base"})
#: The first release with user namespaces on by default (the sandbox's hostUsers:
#: false), and the newest release the installed schemas cover.
VERSIONS = ("1.33", "1.37")
ENV_CONFIGMAP = "temper-env"
SINGLE_WRITERS = ("replay", "learner")
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole"}
#: What the build below understands of a kustomization.
KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "patches",
    "configMapGenerator",
}
#: Lists a strategic merge patch merges item by item, on these keys (the API's
#: patchMergeKey); any other list is replaced whole.
MERGE_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "port"),
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schemas ship with kubernetes-validate: nothing here may reach for the network."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the manifest tests must not use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ---------------------------------------------------------------- a kustomize build


def documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomization(directory: Path) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KUSTOMIZATION_KEYS
    assert not unknown, f"{directory}: this test's build does not handle {sorted(unknown)}"
    return spec


@functools.cache
def _build(directory: Path) -> str:
    spec = kustomization(directory)
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        objects += build(path) if path.is_dir() else documents(path)
    objects += [generated(directory, item) for item in spec.get("configMapGenerator", [])]
    for patch in spec.get("patches", []):
        body, target = patch_of(directory, patch)
        for index in matching(objects, target):
            objects[index] = apply(objects[index], body)
    for obj in objects:
        if "namespace" in spec and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = spec["namespace"]
    return json.dumps(objects)


def build(directory: Path) -> list[dict[str, Any]]:
    """What ``kustomize build`` gives for these files: resources, configMapGenerator
    (names without kustomize's hash suffix, which it also leaves out of references),
    patches (strategic merge or RFC 6902), namespace.  A fresh copy on every call."""
    objects: list[dict[str, Any]] = json.loads(_build(directory))
    return objects


def generated(directory: Path, spec: dict[str, Any]) -> dict[str, Any]:
    data = {}
    for entry in spec.get("files", []):
        key, _, source = entry.rpartition("=")
        data[key or Path(source).name] = (directory / source).read_text()
    for entry in spec.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    meta = {"name": spec["name"]}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def patch_of(directory: Path, patch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The patch's body and the target it names (a strategic merge patch names its own)."""
    [body] = documents(directory / patch["path"])
    target = patch.get("target")
    if target is None:
        assert isinstance(body, dict), f"{patch['path']}: a JSON patch needs a target"
        target = {"kind": body["kind"], "name": body["metadata"]["name"]}
    return body, target


def matching(objects: list[dict[str, Any]], target: dict[str, Any]) -> list[int]:
    unknown = set(target) - {"kind", "name", "labelSelector"}
    assert not unknown, f"this test's build does not select by {sorted(unknown)}"
    wanted = dict(pair.split("=") for pair in target.get("labelSelector", "").split(",") if pair)
    found = [
        index
        for index, obj in enumerate(objects)
        if obj["kind"] == target.get("kind", obj["kind"])
        and obj["metadata"]["name"] == target.get("name", obj["metadata"]["name"])
        and wanted.items() <= obj["metadata"].get("labels", {}).items()
    ]
    assert found, f"no resource matches the patch target {target}"
    return found


def apply(obj: dict[str, Any], body: Any) -> dict[str, Any]:
    if isinstance(body, list):
        return json_patch(obj, body)
    merged: dict[str, Any] = merge(obj, body)
    return merged


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """A strategic merge patch, as far as these manifests use one."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = merge(base[key], value, key) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = next(k for k in MERGE_KEYS[field] if all(k in item for item in base + patch))
        merged_items = list(base)
        for item in patch:
            same = [i for i, old in enumerate(merged_items) if old[key] == item[key]]
            if same:
                merged_items[same[0]] = merge(merged_items[same[0]], item)
            else:
                merged_items.append(item)
        return merged_items
    return patch


def json_patch(obj: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add, replace and remove; a path that does not exist fails."""
    doc = copy.deepcopy(obj)
    for operation in operations:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = last if isinstance(node, dict) else (len(node) if last == "-" else int(last))
        if operation["op"] == "add" and isinstance(node, list):
            node.insert(key, operation["value"])
        elif operation["op"] == "add":
            node[key] = operation["value"]
        elif operation["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), operation
            node[key] = operation["value"]
        elif operation["op"] == "remove":
            del node[key]
        else:
            raise AssertionError(f"this test's build does not apply {operation['op']!r}")
    return doc


# ---------------------------------------------------------------- lookups


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def workloads(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (o for o in objects if o["kind"] in ("Deployment", "StatefulSet"))


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']}: container {name}"
    return found[0]


def runs_temper(item: dict[str, Any]) -> bool:
    """The Temper image with its entrypoint (``temper``), or a command that calls it."""
    if not item["image"].split(":")[0].startswith("temper"):
        return False
    command = " ".join(item.get("command", []))
    return not command or re.search(r"(^|[\s;&|])temper\s", command) is not None


def env_of(objects: list[dict[str, Any]], item: dict[str, Any]) -> dict[str, str]:
    """The container's environment: its ConfigMaps, then its own values.  A value from
    the downward API (a resource limit) reads "2", like a limit of two CPUs would."""
    env: dict[str, str] = {}
    for source in item.get("envFrom", []):
        env |= find(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
    for var in item.get("env", []):
        env[var["name"]] = var["value"] if "value" in var else "2"
    return env


def nats_conf(objects: list[dict[str, Any]]) -> str:
    nats = find(objects, "StatefulSet", "nats")
    [volume] = [v for v in pod_spec(nats)["volumes"] if v["name"] == "config"]
    conf: str = find(objects, "ConfigMap", volume["configMap"]["name"])["data"]["nats.conf"]
    return conf


def quantity(value: str | int) -> float:
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    text = str(value)
    for suffix, scale in suffixes.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * scale
    return float(text)


# ---------------------------------------------------------------- files


def yaml_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def kustomization_dirs() -> list[Path]:
    return sorted(path.parent for path in K8S.rglob("kustomization.yaml"))


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_yaml_document_parses(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{path}: no document"
    for doc in docs:
        if isinstance(doc, list):  # an RFC 6902 patch
            assert all({"op", "path"} <= set(op) for op in doc), path
        else:
            assert {"apiVersion", "kind"} <= set(doc), path
            assert doc["kind"] == "Kustomization" or doc["metadata"]["name"], path


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_file_a_kustomization_names_exists(directory: Path) -> None:
    spec = kustomization(directory)
    for entry in spec.get("resources", []):
        path = directory / entry
        assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{directory}: {entry}"
    for patch in spec.get("patches", []):
        assert (directory / patch["path"]).is_file(), f"{directory}: {patch['path']}"
    for generator in spec.get("configMapGenerator", []):
        for entry in generator.get("files", []):
            assert (directory / entry.rpartition("=")[2]).is_file(), f"{directory}: {entry}"


def test_every_yaml_file_is_used_by_a_kustomization() -> None:
    used = set()
    for directory in kustomization_dirs():
        spec = kustomization(directory)
        used |= {(directory / entry).resolve() for entry in spec.get("resources", [])}
        used |= {(directory / patch["path"]).resolve() for patch in spec.get("patches", [])}
        used.add((directory / "kustomization.yaml").resolve())
    assert [p for p in yaml_files() if p.resolve() not in used] == []


def test_domain_config_copies_match_deploy_domains() -> None:
    spec = kustomization(BUILDS["base"])
    [generator] = [g for g in spec["configMapGenerator"] if g["name"] == "temper-domains"]
    for entry in generator["files"]:
        copy_path = BUILDS["base"] / entry.rpartition("=")[2]
        original = ROOT / "deploy" / copy_path.relative_to(BUILDS["base"])
        assert copy_path.read_bytes() == original.read_bytes(), f"cp {original} {copy_path}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_patches_target_resources_of_the_base(overlay: str) -> None:
    base = build(BUILDS["base"])
    for patch in kustomization(BUILDS[overlay]).get("patches", []):
        body, target = patch_of(BUILDS[overlay], patch)
        matched = [base[i] for i in matching(base, target)]
        assert all(o["kind"] == target["kind"] for o in matched), patch
        if isinstance(body, dict):
            assert body["kind"] == target["kind"], patch


# ---------------------------------------------------------------- schemas


def schema_error(obj: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path)
        return f"{obj['kind']}/{obj['metadata']['name']} ({version}) {where}: {error.message}"
    return None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_object_validates_against_the_kubernetes_schema(name: str, version: str) -> None:
    objects = build(BUILDS[name])
    errors = [error for obj in objects if (error := schema_error(obj, version))]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "replicas"), "two"),
        (("spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"), "9460"),
        (("spec", "template", "spec", "containers", 0, "resources"), ["cpu"]),
        # An unquoted number where the API wants a string (the schemas list no enums).
        (("spec", "template", "spec", "containers", 0, "env", 0, "value"), 4),
        (("spec", "replica"), 1),
    ],
)
def test_the_schema_check_refuses_a_broken_manifest(path: tuple[Any, ...], value: Any) -> None:
    generator = find(build(BUILDS["base"]), "Deployment", "generator")
    node = generator
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    error = schema_error(generator, VERSIONS[-1])
    assert error is not None and error.startswith("Deployment/generator")


# ---------------------------------------------------------------- topology


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_registered_service_has_a_deployment(name: str) -> None:
    objects = build(BUILDS[name])
    for service in registry.BUILTIN:
        main = container(find(objects, "Deployment", service), service)
        args = build_parser().parse_args(main["args"])
        assert (args.command, args.name) == ("serve", service)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_probes_ask_temper_check_for_their_service(name: str) -> None:
    objects = build(BUILDS[name])
    for service in registry.BUILTIN:
        main = container(find(objects, "Deployment", service), service)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = main[probe]["exec"]["command"]
            assert command[0] == "temper", (service, probe)
            args = build_parser().parse_args(command[1:])
            assert (args.command, args.service) == ("check", service), (service, probe)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_temper_container_gets_nats_url_from_the_configmap(name: str) -> None:
    objects = build(BUILDS[name])
    shared = find(objects, "ConfigMap", ENV_CONFIGMAP)["data"]
    assert shared["TEMPER_NATS_URL"]
    checked = 0
    for workload in workloads(objects):
        for item in filter(runs_temper, containers(workload)):
            refs = [s["configMapRef"]["name"] for s in item.get("envFrom", [])]
            assert ENV_CONFIGMAP in refs, (workload["metadata"]["name"], item["name"])
            own = {var["name"] for var in item.get("env", [])}
            assert "TEMPER_NATS_URL" not in own, (workload["metadata"]["name"], item["name"])
            checked += 1
    assert checked > len(registry.BUILTIN)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_nats_is_three_servers_routed_to_each_other(name: str) -> None:
    objects = build(BUILDS[name])
    nats = find(objects, "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["podManagementPolicy"] == "Parallel"
    headless = find(objects, "Service", nats["spec"]["serviceName"])["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    conf = nats_conf(objects)
    [block] = re.findall(r"routes: \[(.*?)\]", conf, re.S)
    routes = block.split()
    port = re.search(r"cluster \{.*?listen: [\d.]+:(\d+)", conf, re.S)
    assert port is not None
    pods = [f"nats-{i}.{nats['spec']['serviceName']}" for i in range(3)]
    assert routes == [f"nats://{pod}:{port[1]}" for pod in pods]
    [store] = re.findall(r"store_dir: (\S+)", conf)
    [claim] = nats["spec"]["volumeClaimTemplates"]
    mounts = container(nats, "nats")["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": store} in mounts


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_the_shared_env_names_every_nats_server(name: str) -> None:
    objects = build(BUILDS[name])
    nats = find(objects, "StatefulSet", "nats")
    shared = find(objects, "ConfigMap", ENV_CONFIGMAP)["data"]
    client = re.search(r"^listen: [\d.]+:(\d+)", nats_conf(objects), re.M)
    assert client is not None
    pods = [f"nats-{i}.{nats['spec']['serviceName']}" for i in range(nats["spec"]["replicas"])]
    assert server_list(shared["TEMPER_NATS_URL"]) == [f"nats://{p}:{client[1]}" for p in pods]
    assert int(shared["TEMPER_STREAM_REPLICAS"]) == nats["spec"]["replicas"]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_service_settings_are_real_fields_and_parse(name: str) -> None:
    objects = build(BUILDS[name])
    for service in registry.BUILTIN:
        deployment = find(objects, "Deployment", service)
        env = env_of(objects, container(deployment, service))
        settings_cls = registry.settings_type(registry.lookup(service).load())
        prefix = f"TEMPER_{service.upper()}_"
        # The service's own variables, and the shared ``TEMPER_<RUNTIME FIELD>``.
        read = variables(settings_cls, prefix)
        for key in env:
            if key.startswith("TEMPER_"):
                assert key in read, key
        settings = from_env(settings_cls, prefix, env)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert settings.runtime.metrics_port == int(annotations["prometheus.io/port"]), service
        assert settings.runtime.metrics_host == "0.0.0.0", service


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_scraped_pods_declare_their_metrics_port(name: str) -> None:
    for workload in workloads(build(BUILDS[name])):
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", workload["metadata"]["name"]
        ports = {p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}
        assert int(annotations["prometheus.io/port"]) in ports, workload["metadata"]["name"]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_container_has_requests_within_limits(name: str) -> None:
    for workload in workloads(build(BUILDS[name])):
        for item in containers(workload):
            where = (workload["metadata"]["name"], item["name"])
            requests, limits = item["resources"]["requests"], item["resources"]["limits"]
            assert {"cpu", "memory"} <= set(requests) & set(limits), where
            for resource, amount in requests.items():
                assert quantity(amount) <= quantity(limits[resource]), (*where, resource)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_replay_and_learner_run_alone(name: str) -> None:
    objects = build(BUILDS[name])
    for service in SINGLE_WRITERS:
        spec = find(objects, "Deployment", service)["spec"]
        assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate", service


@pytest.mark.parametrize("name", ["base", "gpu"])
def test_learner_and_generator_share_read_write_many_volumes(name: str) -> None:
    objects = build(BUILDS[name])
    mounts = {}
    for service in ("learner", "generator"):
        deployment = find(objects, "Deployment", service)
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod_spec(deployment)["volumes"]
            if "persistentVolumeClaim" in v
        }
        main = container(deployment, service)
        mounts[service] = {
            claims[m["name"]]: m["mountPath"] for m in main["volumeMounts"] if m["name"] in claims
        }
    shared = set(mounts["learner"]) & set(mounts["generator"])
    assert shared == {"temper-models", "temper-learner-run"}
    for claim in shared:
        assert mounts["learner"][claim] == mounts["generator"][claim], claim
        assert find(objects, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == [
            "ReadWriteMany"
        ]
    learner = env_of(objects, container(find(objects, "Deployment", "learner"), "learner"))
    assert learner["TEMPER_LEARNER_OUT_DIR"] == mounts["learner"]["temper-learner-run"]


def test_gpu_overlay_puts_sglang_and_the_learner_on_gpus() -> None:
    objects = build(BUILDS["gpu"])
    generator = find(objects, "Deployment", "generator")
    env = env_of(objects, container(generator, "generator"))
    assert env["TEMPER_GENERATOR_ENGINE"] == "sglang"
    gpus = [c for c in containers(generator) if "nvidia.com/gpu" in c["resources"]["limits"]]
    assert [c["name"] for c in gpus] == ["sglang"]
    ports = {p["containerPort"] for p in gpus[0]["ports"]}
    for url in env["TEMPER_GENERATOR_SGLANG_URLS"].split(","):
        assert int(url.rsplit(":", 1)[1]) in ports, url
    learner = find(objects, "Deployment", "learner")
    main = container(learner, "learner")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert env_of(objects, main)["TEMPER_LEARNER_DEVICE"] == "cuda"


def test_cpu_small_overlay_runs_one_of_each() -> None:
    objects = build(BUILDS["cpu-small"])
    replicas = {
        o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"
    }
    assert replicas == dict.fromkeys(registry.BUILTIN, 1)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_sandbox_uses_bwrap_in_a_user_namespace_without_privileges(name: str) -> None:
    objects = build(BUILDS[name])
    sandbox = find(objects, "Deployment", "sandbox")
    main = container(sandbox, "sandbox")
    assert env_of(objects, main)["TEMPER_SANDBOX_BACKEND"] == "bwrap"
    assert pod_spec(sandbox)["hostUsers"] is False
    assert pod_spec(sandbox)["securityContext"]["runAsNonRoot"] is True
    context = main["securityContext"]
    assert context["procMount"] == "Unmasked"
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert not context.get("privileged", False)
