"""The deployment files in deploy/: systemd units, Prometheus config and rules,
Grafana dashboard.

- The units are copied to a temporary directory with their ExecStart paths
  pointed at the built binaries and checked with `systemd-analyze verify`
  (which loads the per-node drop-ins beside them): it must exit 0 and say
  nothing about our files.
- prometheus.yml (with the rules file it loads) must pass
  `promtool check config`.
- The dashboard must be JSON that Grafana can import and must chart every
  metric the coordinator and workers export.

Environment: IE_BUILD_DIR (default <repo>/build) holds ie-coordinator and
ie-worker. systemd-analyze and promtool (Debian's systemd and prometheus
packages, scripts/setup.sh) missing is a FAILURE, never a skip.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BUILD = Path(os.environ.get("IE_BUILD_DIR", REPO / "build"))

METRICS = (
    "ie_requests_total", "ie_tokens_generated_total", "ie_prompt_tokens_total",
    "ie_request_queue_seconds", "ie_step_seconds", "ie_kv_used_ratio",
    "ie_worker_compute_seconds_total", "ie_worker_transfer_seconds_total", "ie_worker_up",
    "process_resident_memory_bytes", "ie_time_to_first_token_seconds", "ie_token_latency_seconds",
    "ie_queue_depth", "ie_running_requests", "ie_kv_blocks_used", "ie_preemptions_total",
    "ie_prefix_cache_hit_tokens_total", "ie_prefix_cache_miss_tokens_total", "ie_step_failures_total",
)
# (name, label) pairs whose label the dashboard must break down by
LABELLED = (("ie_requests_total", "status"), ("ie_worker_compute_seconds_total", "worker"),
            ("ie_worker_transfer_seconds_total", "worker"), ("ie_worker_up", "worker"))
HISTOGRAMS = ("ie_request_queue_seconds", "ie_step_seconds", "ie_time_to_first_token_seconds",
              "ie_token_latency_seconds")


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found (install it with scripts/setup.sh)", pytrace=False)
    return path


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def binary(name: str) -> str:
    """The built binary, or /bin/true while it does not exist yet (the service
    binaries are written in parallel with these units; verify only needs an
    executable path, so /bin/true keeps the unit check meaningful until then)."""
    p = BUILD / name
    if p.is_file() and os.access(p, os.X_OK):
        return str(p.resolve())
    return "/bin/true"


# ------------------------------------------------------------------ units
def parse_unit(path: Path) -> dict[str, list[str]]:
    """Section.Key -> values (systemd allows a key more than once)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


@pytest.fixture
def unit_dir(tmp_path: Path) -> Path:
    """deploy/'s units and drop-ins with ExecStart pointing at the build."""
    d = tmp_path / "units"
    d.mkdir()
    subst = {"/usr/local/bin/ie-coordinator": binary("ie-coordinator"),
             "/usr/local/bin/ie-worker": binary("ie-worker")}
    for src in DEPLOY.iterdir():
        if src.is_dir() and src.name.endswith(".service.d"):
            shutil.copytree(src, d / src.name)
        elif src.suffix == ".service":
            text = src.read_text()
            for old, new in subst.items():
                text = text.replace(f"ExecStart={old} ", f"ExecStart={new} ")
            (d / src.name).write_text(text)
    return d


def verify(unit_dir: Path, *units: str) -> subprocess.CompletedProcess:
    need_tool("systemd-analyze")
    return run(["systemd-analyze", "verify", "--man=no", *[unit_dir / u for u in units]], cwd=unit_dir)


def own_complaints(cp: subprocess.CompletedProcess, unit_dir: Path) -> list[str]:
    """Lines of verify's output about our files (not about host units)."""
    names = ("ie-coordinator", "ie-worker")
    return [ln for ln in (cp.stdout + cp.stderr).splitlines()
            if str(unit_dir) in ln or any(n in ln for n in names)]


UNITS = ("ie-coordinator.service", "ie-worker@0.service", "ie-worker@1.service")


def test_units_verify(unit_dir: Path):
    cp = verify(unit_dir, *UNITS)
    complaints = own_complaints(cp, unit_dir)
    assert cp.returncode == 0 and not complaints, \
        f"systemd-analyze verify: rc={cp.returncode}\n{cp.stdout}{cp.stderr}"


def test_verify_catches_mistakes(unit_dir: Path):
    """The check above means something: a bad key, a bad value and a missing
    binary are each reported."""
    unit = unit_dir / "ie-coordinator.service"
    good = unit.read_text()
    for bad in (good.replace("Type=notify", "Type=notifyy"),
                good.replace("[Service]", "[Service]\nNoSuchSetting=1"),
                re.sub(r"ExecStart=\S+", "ExecStart=/nonexistent/ie-coordinator", good)):
        unit.write_text(bad)
        cp = verify(unit_dir, "ie-coordinator.service")
        assert cp.returncode != 0 or own_complaints(cp, unit_dir), bad
    unit.write_text(good)


def test_coordinator_unit_settings():
    u = parse_unit(DEPLOY / "ie-coordinator.service")
    s = lambda k: u.get(f"Service.{k}", [None])[-1]
    assert s("Type") == "notify"
    assert s("NotifyAccess") == "main"
    assert s("ExecStart") == "/usr/local/bin/ie-coordinator --config /etc/clocher/coordinator.conf"
    assert s("WatchdogSec") == "30"
    assert s("Restart") == "on-failure"
    assert s("NoNewPrivileges") == "yes"
    assert s("ProtectSystem") == "strict"
    assert s("PrivateTmp") == "yes"
    assert "/var/lib/clocher" in (s("ReadWritePaths") or "")
    assert u.get("Install.WantedBy") == ["multi-user.target"]
    # SIGTERM drains for up to --drain-ms (30 s by default): systemd must wait longer
    assert int(s("TimeoutStopSec")) > 30


def test_worker_unit_settings():
    u = parse_unit(DEPLOY / "ie-worker@.service")
    s = lambda k: u.get(f"Service.{k}", [None])[-1]
    assert s("Type") == "notify"
    assert s("NotifyAccess") == "main"
    assert s("ExecStart") == "/usr/local/bin/ie-worker --config /etc/clocher/worker.conf --numa-node %i"
    assert s("WatchdogSec") == "30"
    assert s("Restart") == "always"
    assert s("RestartSec") == "1"
    assert s("ProtectSystem") == "strict"
    # stopped after a draining coordinator
    assert "ie-coordinator.service" in (u.get("Unit.Before", [""])[-1] or "")
    # model loading takes minutes: at least 5 of them before the start fails
    m = re.fullmatch(r"(\d+)(min|s)?", s("TimeoutStartSec") or "")
    assert m and int(m.group(1)) * (60 if m.group(2) == "min" else 1) >= 300
    # NUMA placement per node (systemd 252 expands no %i in NUMAMask=)
    for node in (0, 1):
        d = parse_unit(DEPLOY / f"ie-worker@{node}.service.d" / "numa.conf")
        assert d["Service.NUMAPolicy"] == ["bind"]
        assert d["Service.NUMAMask"] == [str(node)]
        assert d["Service.CPUAffinity"] == ["numa"]


# ------------------------------------------------------------------ prometheus
def test_prometheus_config():
    need_tool("promtool")
    cp = run(["promtool", "check", "config", DEPLOY / "prometheus.yml"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "SUCCESS" in cp.stdout
    text = (DEPLOY / "prometheus.yml").read_text()
    # the coordinator and two workers are scraped
    assert "job_name: ie-coordinator" in text and "job_name: ie-worker" in text
    targets = re.findall(r'"(\d+\.\d+\.\d+\.\d+:\d+)"', text)
    assert len(set(targets)) == 3, targets


def test_prometheus_rules():
    need_tool("promtool")
    cp = run(["promtool", "check", "rules", DEPLOY / "clocher-rules.yml"])
    assert cp.returncode == 0, cp.stdout + cp.stderr


# ------------------------------------------------------------------ grafana
def dashboard_exprs(dash: dict) -> list[str]:
    exprs = []
    for p in dash["panels"]:
        exprs += [t["expr"] for t in p.get("targets", [])]
        for sub in p.get("panels", []):  # collapsed rows
            exprs += [t["expr"] for t in sub.get("targets", [])]
    return exprs


def test_dashboard():
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    panels = dash["panels"]
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        assert p["type"] in ("timeseries", "stat", "gauge", "bargauge", "table", "row"), p["type"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        for t in p.get("targets", []):
            assert t["refId"] and t["expr"]
    exprs = dashboard_exprs(dash)
    text = "\n".join(exprs)
    for name in METRICS:
        assert re.search(rf"\b{name}(_bucket|_sum|_count)?\b", text), f"no panel charts {name}"
    for name in HISTOGRAMS:  # histograms as quantiles over their buckets
        assert any("histogram_quantile(" in e and f"{name}_bucket" in e for e in exprs), name
    for name, label in LABELLED:
        assert any(name in e and label in e for e in exprs), f"{name} not broken down by {label}"
    # counters are charted as rates, never raw
    for e in exprs:
        for name in re.findall(r"\b(ie_\w+_total)\b", e):
            assert re.search(rf"rate\({name}\b", e), e
    # every templated variable a query uses is defined
    defined = {v["name"] for v in dash["templating"]["list"]} | {"__rate_interval", "__interval"}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(panels)))
    assert used <= defined, used - defined
