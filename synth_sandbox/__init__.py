"""Local sandbox provider: the default Harbor environment of the platform.

Pure library code (no Django models): usable from a worker and from a CLI.

* ``Sandbox`` (sandbox.py): bubblewrap namespaces + cgroups, start / exec / stop, file transfer;
  its parts by concern: paths.py (container paths), mounts.py (host layout, bubblewrap
  argv), limits.py, execs.py, files.py, hooks.py, processes.py, owners.py (owner records,
  reap_stale_sandboxes), errors.py; cgroups.py, bridge.py, dns.py, hostfs.py beneath them.
* ``LocalSandboxEnvironment`` (environment.py): the Harbor ``BaseEnvironment`` on top of it,
  ``EnvironmentConfig(import_path="synth_sandbox.environment:LocalSandboxEnvironment")``.
* ``check_task_supported`` (support.py): why a task cannot run locally, before starting it.
* dockerfiles.py, build.py, buildcache.py: ``environment/Dockerfile`` interpreted, checked
  and applied at start (``RUN`` results cached per host); what cannot be applied is refused.

Import the submodules directly; this package imports nothing eagerly so that importing
``synth_sandbox.sandbox`` does not pull in Harbor.
"""

from __future__ import annotations

ENVIRONMENT_IMPORT_PATH = "synth_sandbox.environment:LocalSandboxEnvironment"
# Where the sandbox lived before it became its own package: specs stored then name it so.
MOVED_IMPORT_PATHS = {"apps.runs.sandbox.environment:LocalSandboxEnvironment": ENVIRONMENT_IMPORT_PATH}


def environment_path_current(path: str) -> str:
    """An environment import path as it is today (a stored spec may name where a class was)."""
    return MOVED_IMPORT_PATHS.get(path, path)
