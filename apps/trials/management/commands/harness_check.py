"""`manage.py harness_check ENGINE`: check the installed harness build against the proxy
(apps.trials.harness_check.service); exit 0 if it passed, 1 if it failed, 2 on bad input."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.trials.harness_check.identity import CHECKABLE
from apps.trials.harness_check.service import HarnessCheckError, harness_check_run


class Command(BaseCommand):
    help = (
        "Run ENGINE's installed harness headless on a scripted task through a model proxy process, record the "
        "requests it sends, check that every captured call re-renders to its prompt ids and that tool calls "
        "round-trip, and store the result (a train run needs a passing check of the installed build)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("engine", help=f"the engine to check: {', '.join(CHECKABLE)}")
        parser.add_argument("--json", action="store_true", help="print the whole report as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            check = harness_check_run(engine=opts["engine"])
        except HarnessCheckError as exc:
            self.stderr.write(f"harness_check: {exc}")
            raise SystemExit(2) from None
        if opts["json"]:
            self.stdout.write(json.dumps({"id": check.id, "passed": check.passed, **check.report}, indent=2))
        else:
            self.stdout.write(summary(check=check))
        if not check.passed:
            raise SystemExit(1)


def summary(*, check: Any) -> str:
    """A few lines: the build, the verdict, what was sent, the three checks, the failures."""
    report = check.report
    requests = report["requests"]
    calls, tools = report["calls"], report["tool_calls"]
    endpoints = ", ".join(f"{endpoint} x{n}" for endpoint, n in requests["endpoints"].items()) or "none"
    lines = [
        f"{check.engine} {check.harness_version or '?'} (sha256 {check.digest[:16]}): "
        f"{'PASSED' if check.passed else 'FAILED'}  [{check.id}]",
        f"  requests: {endpoints}",
        f"  headers: {', '.join(requests['header_names'])}",
        f"  tools offered: {len(requests['tool_names'])} ({', '.join(requests['tool_names'][:8])}"
        f"{', ...' if len(requests['tool_names']) > 8 else ''})",
        f"  re-render: {sum(1 for c in calls if c.get('rerenders'))}/{len(calls)} calls; "
        f"tool calls round-trip: {sum(1 for t in tools if t.get('request_matches') and t.get('sampled_ids_in_next_prompt'))}"
        f"/{len(tools)}; task done: {'yes' if report['checks']['harness'] else 'no'}",
    ]
    lines += [f"  FAIL {failure}" for failure in report["failures"]]
    return "\n".join(lines)
