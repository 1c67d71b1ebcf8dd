#!/usr/bin/env python3
"""Renders deploy/helm/agentfleet with Helm and checks every manifest it makes.

Run by deploy/helm/check, which installs the pinned tools first (see deploy/helm/README.md):

1. `helm lint --strict`, then `helm template`, for each values case (CASES);
2. every built-in kind validated strictly (unknown fields are errors) against the Kubernetes
   OpenAPI schemas of KUBERNETES_VERSION (kubernetes-validate); the CRD kinds (KEDA, Prometheus
   Operator) against their published schemas (validate-crds.mjs);
3. what the chart promises, checked on the output: every setting of shared/src/config wired
   (and nothing the binaries would refuse), the code's defaults unchanged unless the chart says
   why, the security context of every container, probes and resources, the drain shorter than
   the grace period, the NetworkPolicy's excepted ranges equal to the code's egress policy, the
   autoscaling signal;
4. values the chart must refuse (MUST_FAIL) are refused;
5. checkov on each case's manifests: zero failed checks (exceptions are `checkov.io/skip<N>`
   annotations in the chart, each with its reason).

Exit 0 when all hold; otherwise every problem is printed and the exit code is 1.
"""

import argparse
import ipaddress
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
import kubernetes_validate

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/agentfleet"
KUBERNETES_VERSION = "1.33.0"
RELEASE, NAMESPACE = "agentfleet", "agentfleet"

# Rendered with the chart's own values, and with every optional part on.
CASES = {
    "default": [],
    "full": ["-f", str(ROOT / "deploy/helm/ci/full-values.yaml")],
}
# Values the chart must refuse, and a word its message must contain.
MUST_FAIL = {
    "grace period shorter than the drain": (
        ["--set", "worker.terminationGracePeriodSeconds=40"],
        "terminationGracePeriodSeconds",
    ),
    "worker without its health server": (
        ["--set", "config.worker.metrics_listen="],
        "metrics_listen",
    ),
    "autoscaling from zero workers": (
        ["--set", "autoscaling.enabled=true", "--set", "autoscaling.minReplicas=0"],
        "minReplicas",
    ),
    "an API disruption budget no drain can meet": (
        ["--set", "api.replicas=2"],
        "minAvailable",
    ),
    "ServiceMonitor without API metrics": (
        ["--set", "serviceMonitor.enabled=true", "--set", "config.api.metrics_listen="],
        "metrics_listen",
    ),
}
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule"}

# Settings that are secrets: they go into the Secret, never the ConfigMap.
SECRET_SETTINGS = {
    "database.url",
    "redis.url",
    "redis.cluster_nodes",
    "amqp.url",
    "api.stream_token_secret",
    "api.admin_token",
    "webhooks.encryption_key",
    "mcp.encryption_key",
}
# Where values.yaml deliberately differs from the code's default (values.yaml says why).
CHART_DEFAULTS = {
    "api.listen": "0.0.0.0:8080",
    "api.admin_listen": "0.0.0.0:8081",
    "api.metrics_listen": "0.0.0.0:9091",
    "worker.metrics_listen": "0.0.0.0:9090",
    "telemetry.log_format": "json",
}
# The drain gives runs that ignore its deadline this long more (worker/src/drain.rs).
DRAIN_EXTRA_SECS = 10

problems: list[str] = []


def problem(msg: str) -> None:
    problems.append(msg)
    print(f"  FAIL {msg}")


# --- what the code says ------------------------------------------------------------------


def code_defaults() -> dict[str, object]:
    """`section.key` -> default, from shared/src/config/defaults.toml (the binaries' defaults)."""
    path = ROOT / "shared/src/config/defaults.toml"
    if not path.exists():
        sys.exit(f"check: {path.relative_to(ROOT)} not found")
    return {
        f"{section}.{key}": value
        for section, keys in tomllib.loads(path.read_text()).items()
        for key, value in keys.items()
    }


def model_keys() -> set[str]:
    """The fields of ModelSettings (models.<name>.<field>)."""
    src = (ROOT / "shared/src/config/models.rs").read_text()
    m = re.search(r"pub struct ModelSettings \{(.*?)\n\}", src, re.S)
    if not m:
        sys.exit("check: ModelSettings not found in shared/src/config/models.rs")
    return set(re.findall(r"pub (\w+):", m.group(1)))


def egress_denied() -> set[ipaddress._BaseNetwork]:
    """The ranges shared/src/egress.rs refuses, as networks."""
    src = (ROOT / "shared/src/egress.rs").read_text()
    nets = set()
    for body, bits, cls in (
        (r"const DENIED_V4: \[\(u32, u8\); \d+\] = \[(.*?)\];", 32, ipaddress.IPv4Network),
        (r"fn is_public_v6.*?DENIED: \[\(u128, u8\); \d+\] = \[(.*?)\];", 128, ipaddress.IPv6Network),
    ):
        m = re.search(body, src, re.S)
        if not m:
            sys.exit("check: the DENIED ranges were not found in shared/src/egress.rs")
        for expr, length in re.findall(r"\(([0-9a-fx_ <]+), (\d+)\)", m.group(1)):
            value = 0
            parts = [p.strip().replace("_", "") for p in expr.split("<<")]
            value = int(parts[0], 0) << (int(parts[1]) if len(parts) == 2 else 0)
            nets.add(cls((value, int(length))))
    return nets


# --- rendering ---------------------------------------------------------------------------


def helm(helm_bin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_bin, *args], capture_output=True, text=True)


def render(helm_bin: str, values: list[str]) -> list[dict]:
    lint = helm(helm_bin, "lint", "--strict", str(CHART), *values)
    if lint.returncode != 0:
        problem(f"helm lint: {lint.stdout}{lint.stderr}")
    out = helm(helm_bin, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values)
    if out.returncode != 0:
        problem(f"helm template: {out.stderr}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def write_manifests(docs: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.yaml"):
        old.unlink()
    for i, doc in enumerate(docs):
        name = f"{i:02d}-{doc['kind']}-{doc['metadata']['name']}.yaml".lower()
        (out / name).write_text(yaml.safe_dump(doc, sort_keys=False))


# --- checks ------------------------------------------------------------------------------


def validate_schemas(docs: list[dict], crd_out: Path) -> list[dict]:
    crds = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in CRD_KINDS:
            crds.append(doc)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problem(f"{where}: no Kubernetes {KUBERNETES_VERSION} schema for this kind")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problem(f"{where}: {path}: {e.message}")
    crd_out.write_text(json.dumps(crds))
    return crds


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, suffix: str) -> dict | None:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    if len(found) != 1:
        problem(f"expected one {kind} named *{suffix}, found {len(found)}")
        return None
    return found[0]


def env_key(setting: str) -> str:
    return "AGENTFLEET__" + setting.replace(".", "__").upper()


def check_values_mirror_code(defaults: dict[str, object]) -> None:
    """values.yaml lists every setting, under its own name, with the code's default."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    config = values["config"]
    listed = {
        f"{s}.{k}": v for s, keys in config.items() if s != "models" for k, v in keys.items()
    }
    secret = {
        f"{s}.{k}" for s, keys in values["secrets"]["values"].items() if s != "models" for k in keys
    }
    for key, default in defaults.items():
        if key in SECRET_SETTINGS:
            if key not in secret:
                problem(f"values.yaml: secret setting {key} missing from secrets.values")
            if key in listed:
                problem(f"values.yaml: secret setting {key} must not be in config (the ConfigMap)")
            continue
        if key not in listed:
            problem(f"values.yaml: setting {key} (shared/src/config/defaults.toml) missing from config")
            continue
        want = CHART_DEFAULTS.get(key, default)
        if listed[key] != want:
            problem(f"values.yaml: config.{key} is {listed[key]!r}, the code's default {default!r}"
                    + (f" (the chart's: {want!r})" if key in CHART_DEFAULTS else ""))
    for key in listed.keys() | secret:
        if key not in defaults:
            problem(f"values.yaml: {key} is no setting of shared/src/config "
                    "(the binaries refuse unknown keys)")


def check_wiring(docs: list[dict], defaults: dict[str, object], secret_made: bool) -> None:
    """Every setting reaches the pods: the ConfigMap has every non-secret one, and the Secret's
    secrets.toml (when the chart makes it) the secret ones; models only with known fields."""
    cm = one(docs, "ConfigMap", RELEASE)
    if cm is None:
        return
    data = cm.get("data", {})
    fields = model_keys()
    for key in defaults:
        if key in SECRET_SETTINGS:
            if env_key(key) in data:
                problem(f"ConfigMap: carries the secret {env_key(key)}")
        elif env_key(key) not in data:
            problem(f"ConfigMap: {env_key(key)} missing")
    known = {env_key(k) for k in defaults}
    for name in data:
        m = re.fullmatch(r"AGENTFLEET__MODELS__[A-Z0-9_]+?__([A-Z_]+)", name)
        if m and m.group(1).lower() in fields:
            continue
        if name not in known:
            problem(f"ConfigMap: {name} is no setting of shared/src/config")
    if data.get("AGENTFLEET__DATABASE__MIGRATE_ON_START") != "false":
        problem("ConfigMap: database.migrate_on_start must be false (the Job migrates)")
    if secret_made:
        secret = one(docs, "Secret", RELEASE)
        if secret is None:
            return
        try:
            toml = tomllib.loads(secret.get("stringData", {}).get("secrets.toml", ""))
        except tomllib.TOMLDecodeError as e:
            problem(f"Secret: secrets.toml is not TOML: {e}")
            return
        for section, keys in toml.items():
            for key, value in keys.items():
                if section == "models":
                    unknown = set(value) - fields
                    if unknown:
                        problem(f"Secret: models.{key}: unknown fields {sorted(unknown)}")
                elif f"{section}.{key}" not in SECRET_SETTINGS:
                    problem(f"Secret: {section}.{key} is no secret setting")
        for key in SECRET_SETTINGS:
            section, name = key.split(".")
            if name not in toml.get(section, {}):
                problem(f"Secret: secrets.toml lacks {key}")


def pod_specs(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc, doc["spec"]["template"]["spec"]


def check_pods(docs: list[dict]) -> None:
    for doc, spec in pod_specs(docs):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        psc = spec.get("securityContext", {})
        if not psc.get("runAsNonRoot"):
            problem(f"{where}: pod securityContext.runAsNonRoot is not true")
        if spec.get("automountServiceAccountToken") is not False:
            problem(f"{where}: mounts a service account token (the binaries never call the API)")
        for c in spec["containers"]:
            cw = f"{where}/{c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True:
                problem(f"{cw}: root filesystem is not read-only")
            if sc.get("allowPrivilegeEscalation") is not False:
                problem(f"{cw}: privilege escalation is not off")
            if sc.get("privileged"):
                problem(f"{cw}: privileged")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problem(f"{cw}: capabilities are not all dropped")
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(part, {}):
                        problem(f"{cw}: no {part}.{r}")
            refs = [next(iter(e)) for e in c.get("envFrom", [])]
            if refs != ["configMapRef"]:
                problem(f"{cw}: envFrom must read the settings ConfigMap (and nothing secret)")
            config = {e["name"]: e.get("value") for e in c.get("env", [])}.get("AGENTFLEET_CONFIG", "")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            mount = mounts.get(str(Path(config).parent)) if config else None
            if not mount or "secret" not in volumes.get(mount, {}):
                problem(f"{cw}: AGENTFLEET_CONFIG does not name the file mounted from the Secret")
            if doc["kind"] == "Deployment":
                ports = {p["name"] for p in c.get("ports", [])}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    p = c.get(probe)
                    if not p:
                        problem(f"{cw}: no {probe}")
                    elif p["httpGet"]["port"] not in ports:
                        problem(f"{cw}: {probe} names port {p['httpGet']['port']!r}, not a container port")


def listen_port(value: str) -> int:
    return int(value.rsplit(":", 1)[1])


def check_components(docs: list[dict]) -> None:
    cm = one(docs, "ConfigMap", RELEASE)
    api = one(docs, "Deployment", "-api")
    worker = one(docs, "Deployment", "-worker")
    if not (cm and api and worker):
        return
    data = cm["data"]
    ports = {p["name"]: p["containerPort"] for p in api["spec"]["template"]["spec"]["containers"][0]["ports"]}
    if ports.get("http") != listen_port(data["AGENTFLEET__API__LISTEN"]):
        problem("API: container port http differs from api.listen")
    if data["AGENTFLEET__API__METRICS_LISTEN"] and ports.get("metrics") != listen_port(data["AGENTFLEET__API__METRICS_LISTEN"]):
        problem("API: container port metrics differs from api.metrics_listen")
    admin_listen = data["AGENTFLEET__API__ADMIN_LISTEN"]
    if admin_listen and ports.get("admin") != listen_port(admin_listen):
        problem("API: container port admin differs from api.admin_listen")
    # The admin API has a Service of its own, with nothing else; the public one never has it.
    public = one(docs, "Service", "-api")
    if public and "admin" in {p.get("targetPort") for p in public["spec"]["ports"]}:
        problem("Service/-api: the public Service exposes the admin port")
    admin = [d for d in docs if d["kind"] == "Service"
             and d["metadata"]["labels"].get("agentfleet.dev/admin") == "true"]
    if admin_listen:
        if len(admin) != 1:
            problem(f"API: expected one admin Service, found {len(admin)}")
        for s in admin:
            if [p["targetPort"] for p in s["spec"]["ports"]] != ["admin"] or s["spec"]["type"] != "ClusterIP":
                problem(f"Service/{s['metadata']['name']}: an admin Service is ClusterIP and exposes only the admin port")
    elif admin:
        problem("API: an admin Service without api.admin_listen")
    wspec = worker["spec"]["template"]["spec"]
    wports = {p["name"]: p["containerPort"] for p in wspec["containers"][0]["ports"]}
    if wports.get("metrics") != listen_port(data["AGENTFLEET__WORKER__METRICS_LISTEN"]):
        problem("worker: container port metrics differs from worker.metrics_listen")
    drain = int(data["AGENTFLEET__WORKER__DRAIN_GRACE_MS"]) / 1000 + DRAIN_EXTRA_SECS
    if wspec["terminationGracePeriodSeconds"] <= drain:
        problem(f"worker: terminationGracePeriodSeconds {wspec['terminationGracePeriodSeconds']} "
                f"does not exceed the drain ({drain:.0f} s)")
    if [c["command"] for c in api["spec"]["template"]["spec"]["containers"]] != [["agentfleet-api", "serve"]]:
        problem("API: command is not agentfleet-api serve")
    if [c["command"] for c in wspec["containers"]] != [["agentfleet-worker"]]:
        problem("worker: command is not agentfleet-worker")
    job = one(docs, "Job", "-migrate")
    if job:
        hooks = set(job["metadata"]["annotations"].get("helm.sh/hook", "").split(","))
        if hooks != {"pre-install", "pre-upgrade"}:
            problem(f"migration Job: hooks {hooks}, want pre-install and pre-upgrade")
        if job["spec"]["template"]["spec"]["containers"][0]["command"] != ["agentfleet-api", "migrate"]:
            problem("migration Job: command is not agentfleet-api migrate")
    for kind, want in (("PodDisruptionBudget", 2),):
        if len(by_kind(docs, kind)) != want:
            problem(f"expected {want} {kind}s")


def check_full(docs: list[dict]) -> None:
    """The optional parts: KEDA on the right signal, the egress NetworkPolicy, monitoring."""
    cm = one(docs, "ConfigMap", RELEASE)
    so = one(docs, "ScaledObject", "-worker")
    if so and cm:
        trig = so["spec"]["triggers"]
        query = trig[0]["metadata"]["query"] if trig and trig[0]["type"] == "prometheus" else ""
        for metric in ("agentfleet_runnable_runs", "agentfleet_runs_in_flight"):
            if metric not in query:
                problem(f"ScaledObject: the query does not use {metric}: {query!r}")
        slots = int(cm["data"]["AGENTFLEET__WORKER__CONCURRENCY"])
        threshold = float(trig[0]["metadata"]["threshold"])
        if not 0 < threshold <= slots:
            problem(f"ScaledObject: threshold {threshold} is not within a worker's {slots} slots")
        if so["spec"]["minReplicaCount"] < 1:
            problem("ScaledObject: minReplicaCount below 1")
        worker = one(docs, "Deployment", "-worker")
        if worker and "replicas" in worker["spec"]:
            problem("worker Deployment sets replicas while KEDA owns them")
    np = one(docs, "NetworkPolicy", "-worker")
    if np:
        denied = egress_denied()
        publics = [
            to["ipBlock"] for rule in np["spec"]["egress"] for to in rule.get("to", [])
            if "ipBlock" in to and to["ipBlock"]["cidr"] in ("0.0.0.0/0", "::/0")
        ]
        excepted = {ipaddress.ip_network(e) for b in publics for e in b.get("except", [])}
        if len(publics) != 2:
            problem("worker NetworkPolicy: expected the public IPv4 and IPv6 rules")
        if excepted != denied:
            missing = sorted(map(str, denied - excepted))
            extra = sorted(map(str, excepted - denied))
            problem(f"worker NetworkPolicy: excepted ranges differ from shared/src/egress.rs: "
                    f"missing {missing}, extra {extra}")
    one(docs, "NetworkPolicy", "-api")
    sm = one(docs, "ServiceMonitor", RELEASE)
    if sm:
        services = [d for d in by_kind(docs, "Service")
                    if d["metadata"]["labels"].get("agentfleet.dev/metrics") == "true"]
        if len(services) != 2:
            problem(f"ServiceMonitor: expected the API's and the workers' metrics Services, found {len(services)}")
        for s in services:
            if [p["name"] for p in s["spec"]["ports"]] != ["metrics"]:
                problem(f"Service/{s['metadata']['name']}: a metrics Service exposes only metrics")
    rule = one(docs, "PrometheusRule", RELEASE)
    if rule:
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                url = r.get("annotations", {}).get("runbook_url", "")
                if "RUNBOOK_BASE" in url or "#" not in url:
                    problem(f"PrometheusRule: {r.get('alert')}: runbook_url {url!r}")
                elif url.rsplit("#", 1)[1] not in runbook_anchors():
                    problem(f"PrometheusRule: {r.get('alert')}: runbook_url {url!r} names no "
                            f"heading of docs/operations.md")


def runbook_anchors() -> set[str]:
    """The anchors GitHub gives docs/operations.md's headings: lower case, punctuation dropped,
    spaces as hyphens. An alert's runbook_url must land on one of them."""
    anchors = set()
    for line in (ROOT / "docs/operations.md").read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def check_refusals(helm_bin: str) -> None:
    for what, (args, word) in MUST_FAIL.items():
        out = helm(helm_bin, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
        if out.returncode == 0:
            problem(f"the chart rendered with {what} ({' '.join(args)})")
        elif word not in out.stderr:
            problem(f"the chart refused {what}, but its message lacks {word!r}: {out.stderr.strip()}")
        else:
            print(f"  ok   refused: {what}")


def checkov(checkov_bin: str, directory: Path) -> None:
    out = subprocess.run(
        [checkov_bin, "-d", str(directory), "--framework", "kubernetes", "--quiet", "--compact",
         "-o", "json", "--skip-download"],
        capture_output=True, text=True,
    )
    try:
        reports = json.loads(out.stdout)
    except json.JSONDecodeError:
        problem(f"checkov gave no report (exit {out.returncode}): {out.stderr[-2000:]}")
        return
    if isinstance(reports, dict):
        reports = [reports]
    passed = failed = skipped = 0
    for report in reports:
        summary = report.get("summary", {})
        passed += summary.get("passed", 0)
        failed += summary.get("failed", 0)
        skipped += summary.get("skipped", 0)
        for f in report.get("results", {}).get("failed_checks", []):
            problem(f"checkov {f['check_id']} ({f['check_name']}): {f['resource']} in {Path(f['file_path']).name}")
    if passed == 0:
        problem(f"checkov ran no check on {directory}")
    print(f"  checkov {directory.name}: {passed} passed, {failed} failed, {skipped} skipped (justified in the chart)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    ap.add_argument("--checkov", required=True)
    ap.add_argument("--node", default="node")
    ap.add_argument("--crd-modules", required=True, help="node_modules with @kubernetes-models")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    defaults = code_defaults()
    print("== chart values against shared/src/config")
    check_values_mirror_code(defaults)
    for case, values in CASES.items():
        print(f"== case {case}: render, validate (Kubernetes {KUBERNETES_VERSION}), invariants")
        docs = render(args.helm, values)
        if not docs:
            problem(f"case {case}: nothing rendered")
            continue
        out = args.out / case
        write_manifests(docs, out)
        crd_file = args.out / f"{case}-crds.json"
        crds = validate_schemas(docs, crd_file)
        if crds:
            res = subprocess.run(
                [args.node, str(ROOT / "deploy/helm/validate-crds.mjs"), args.crd_modules,
                 str(crd_file)],
                capture_output=True, text=True,
            )
            print(res.stdout, end="")
            if res.returncode != 0:
                problem(f"CRD validation: {res.stdout}{res.stderr}")
        kinds = sorted({d["kind"] for d in docs})
        print(f"  {len(docs)} manifests: {', '.join(kinds)}")
        secret_made = any(d["kind"] == "Secret" and d["metadata"]["name"] == RELEASE for d in docs)
        check_wiring(docs, defaults, secret_made)
        check_pods(docs)
        check_components(docs)
        if case == "full":
            check_full(docs)
        checkov(args.checkov, out)
    print("== values the chart must refuse")
    check_refusals(args.helm)
    if problems:
        print(f"helm check: {len(problems)} problem(s)")
        return 1
    print("helm check: chart rendered, validated and scanned; no problem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
