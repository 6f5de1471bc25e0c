"""cgroup discovery and limit files on synthetic hierarchies (v1, hybrid, v2-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth_sandbox import cgroups as cgroups_module
from synth_sandbox.cgroups import SandboxCgroup, detect_hierarchies, make_plan


def _mountinfo(root: Path, *, v1: bool, v2: bool) -> str:
    lines = [f"31 23 0:28 / {root} rw,relatime - tmpfs tmpfs rw,mode=755"]
    if v1:
        lines += [
            f"32 31 0:29 / {root}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct",
            f"35 31 0:32 / {root}/memory rw,relatime - cgroup cgroup rw,memory",
            f"37 31 0:34 / {root}/freezer rw,relatime - cgroup cgroup rw,freezer",
            f"39 31 0:36 / {root}/pids rw,relatime - cgroup cgroup rw,pids",
            f"40 31 0:37 / {root}/systemd rw,relatime - cgroup cgroup rw,name=systemd",
        ]
    if v2:
        lines.append(f"41 31 0:38 / {root}/unified rw,relatime - cgroup2 cgroup2 rw")
    return "\n".join(lines) + "\n"


PROC_CGROUP = "9:name=systemd:/\n8:pids:/worker\n6:freezer:/\n4:memory:/worker\n1:cpu,cpuacct:/\n0::/worker.service\n"


def test_hybrid_host_uses_v1_controllers_and_v2_for_tracking(tmp_path: Path) -> None:
    for d in ("cpu,cpuacct", "memory", "freezer", "pids/worker", "memory/worker", "systemd", "unified/worker.service"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "unified" / "worker.service" / "cgroup.controllers").write_text("")
    hierarchies = detect_hierarchies(mountinfo=_mountinfo(tmp_path, v1=True, v2=True), proc_cgroup=PROC_CGROUP)
    by_mount = {h.mountpoint.name: h for h in hierarchies}
    assert set(by_mount) == {"cpu,cpuacct", "memory", "freezer", "pids", "unified"}  # named hierarchy skipped
    # Sandboxes are created below the worker's own cgroup in each hierarchy.
    assert by_mount["memory"].parent == tmp_path / "memory" / "worker" / "synth-sandbox"
    assert by_mount["unified"].parent == tmp_path / "unified" / "worker.service" / "synth-sandbox"
    plan = make_plan(hierarchies)
    assert plan.by_controller["memory"].version == 1 and plan.by_controller["cpu"].version == 1
    assert plan.tracking is not None and plan.tracking.version == 2
    assert plan.freezer is None  # cgroup.kill makes the v1 freezer unnecessary

    cg = SandboxCgroup.create(plan, "sbx")
    result = cg.apply_limits(memory_bytes=64 << 20, pids_max=100, cpus=1.5)
    assert result.enforced == {"memory_bytes": 64 << 20, "pids_max": 100, "cpus": 1.5}
    assert (tmp_path / "memory/worker/synth-sandbox/sbx/memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (tmp_path / "pids/worker/synth-sandbox/sbx/pids.max").read_text() == "100"
    assert (tmp_path / "cpu,cpuacct/synth-sandbox/sbx/cpu.cfs_quota_us").read_text() == "150000"
    assert len(cg.procs_files) == 4  # memory, pids, cpu (v1) + cgroup2 for tracking; no freezer
    # The v1 cpu hierarchy is not the tracking one: an exec joins it last, from inside.
    cpu_procs = tmp_path / "cpu,cpuacct/synth-sandbox/sbx/cgroup.procs"
    assert cg.cpu_procs_file == cpu_procs
    exec_cg = cg.child("exec-1")  # tracked in its own cgroup2 child, the cpu share is the sandbox's
    assert exec_cg.cpu_procs_file == cpu_procs
    assert tmp_path / "unified/worker.service/synth-sandbox/sbx/exec-1/cgroup.procs" in exec_cg.procs_files


def test_the_cpu_cgroup_is_joined_first_where_it_tracks_or_the_kernel_checks_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for d in ("cpu,cpuacct", "memory", "freezer", "pids", "unified"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("")
    hybrid = detect_hierarchies(mountinfo=_mountinfo(tmp_path, v1=True, v2=True), proc_cgroup="")
    only_cpu = [h for h in hybrid if h.mountpoint.name == "cpu,cpuacct"]
    # Tracked in the cpu hierarchy itself (no other): every helper must be in it from the start.
    plan = make_plan(only_cpu)
    assert plan.tracking is not None and plan.tracking.mountpoint.name == "cpu,cpuacct"
    assert SandboxCgroup.create(plan, "a").cpu_procs_file is None
    # A kernel before 5.16 checks the writer's credentials: the sandbox's shell could not join.
    monkeypatch.setattr(cgroups_module, "open_time_migration_checks", lambda: False)
    assert SandboxCgroup.create(make_plan(hybrid), "b").cpu_procs_file is None


def test_v2_only_host(tmp_path: Path) -> None:
    root = tmp_path
    (root / "worker.service").mkdir(parents=True)
    (root / "worker.service" / "cgroup.controllers").write_text("cpu memory pids io\n")
    (root / "worker.service" / "cgroup.subtree_control").write_text("")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    hierarchies = detect_hierarchies(mountinfo=mountinfo, proc_cgroup="0::/worker.service\n")
    assert len(hierarchies) == 1 and hierarchies[0].controllers == {"cpu", "memory", "pids", "io"}
    plan = make_plan(hierarchies)
    assert {c: h.version for c, h in plan.by_controller.items()} == {"memory": 2, "pids": 2, "cpu": 2}
    cg = SandboxCgroup.create(plan, "sbx")
    # Controllers are enabled for the sandboxes' parent (a real cgroupfs would refuse this if
    # the worker's own cgroup held processes; that failure is reported, not hidden).
    assert (root / "worker.service" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    (root / "worker.service/synth-sandbox/sbx/memory.swap.max").write_text("max")
    result = cg.apply_limits(memory_bytes=1 << 30, pids_max=512, cpus=0.5)
    assert not result.unenforced
    sbx = root / "worker.service/synth-sandbox/sbx"
    assert (sbx / "memory.max").read_text() == str(1 << 30)
    assert (sbx / "memory.swap.max").read_text() == "0"
    assert (sbx / "cpu.max").read_text() == "50000 100000"
    assert (sbx / "pids.max").read_text() == "512"
    # cgroup v2: the cpu controller is in the tracking hierarchy, joined by the first helper.
    assert cg.cpu_procs_file is None


def test_no_cgroups_reports_why(tmp_path: Path) -> None:
    plan = make_plan(detect_hierarchies(mountinfo="", proc_cgroup=""))
    assert plan.tracking is None and not plan.by_controller
    assert set(plan.problems) == {"memory", "pids", "cpu", "tracking"}
