"""`synth run watch` (and `--follow` on `run start` / `train start`): a run's live progress.

The run, its trials and (for training) its learning updates are polled every
`--interval` seconds; polling rather than the event stream because every figure shown
(done/total, running, failed, mean reward) is a count over trials, which the list views
give whole, whatever events a reconnect may have skipped. On a terminal the display is a
rich live view (a bar, counts, ETA); otherwise it is one plain line per change, so a log
file or CI output stays readable. --json prints one progress object per change.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.text import Text

from synth_cli.cli import JsonOpt, api_open
from synth_cli.errors import CliError
from synth_cli.http import Api
from synth_cli.output import Ui
from synth_cli.run_outputs import run_collection, run_path

RUN_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
TRIAL_DONE = frozenset({"succeeded", "failed", "cancelled", "lost"})
TRIAL_RUNNING = frozenset({"running", "waiting"})
UPDATE_DONE = frozenset({"applied", "skipped", "failed"})


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def progress_of(
    *, run: dict[str, Any], trials: list[dict[str, Any]], updates: list[dict[str, Any]], now: datetime
) -> dict[str, Any]:
    """The figures the display shows, from the server's run, trial and update objects."""
    statuses = [t.get("status") for t in trials]
    rewards = [float(t["reward"]) for t in trials if t.get("status") in TRIAL_DONE and t.get("reward") is not None]
    done = sum(1 for s in statuses if s in TRIAL_DONE)
    total = len(trials)
    started = _parse_time(run.get("started_at"))
    finished = _parse_time(run.get("finished_at"))
    elapsed = ((finished or now) - started).total_seconds() if started else None
    progress: dict[str, Any] = {
        "run": run.get("id"),
        "kind": run.get("kind"),
        "status": run.get("status"),
        "total": total,
        "done": done,
        "running": sum(1 for s in statuses if s in TRIAL_RUNNING),
        "pending": sum(1 for s in statuses if s == "pending"),
        "failed": sum(1 for s in statuses if s in ("failed", "lost")),
        "scored": len(rewards),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "elapsed_sec": round(elapsed, 1) if elapsed is not None else None,
        "eta_sec": None,
    }
    # The ETA extrapolates the pace so far: trials for a run of fixed size, steps for training
    # (whose trials are made step by step, so their total grows as it goes).
    finished_units, all_units = done, total
    if run.get("kind") == "train":
        steps = (run.get("plan") or {}).get("steps")
        settled = [u for u in updates if u.get("status") in UPDATE_DONE]
        last = settled[-1] if settled else None
        metrics = (last or {}).get("metrics") or {}
        progress.update(
            steps=steps,
            steps_done=len(settled),
            step=min(len(settled) + 1, steps) if isinstance(steps, int) else len(settled) + 1,
            last_reward=metrics.get("reward_mean"),
            last_loss=metrics.get("loss_sum"),
        )
        finished_units, all_units = len(settled), steps if isinstance(steps, int) else 0
    if elapsed and finished_units and all_units > finished_units and run.get("status") not in RUN_TERMINAL:
        progress["eta_sec"] = round(elapsed / finished_units * (all_units - finished_units), 1)
    return progress


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _reward(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def progress_line(progress: dict[str, Any], *, timings: bool = True) -> str:
    """One plain line: what is printed when stdout is not a terminal."""
    parts = [
        f"{progress['run']} {progress['status']}",
        f"{progress['done']}/{progress['total']} done",
        f"{progress['running']} running",
        f"{progress['failed']} failed",
        f"mean reward {_reward(progress['mean_reward'])}",
    ]
    if progress.get("kind") == "train":
        parts.insert(1, f"step {progress['step']}/{progress.get('steps') or '?'}")
        parts.append(f"last step reward {_reward(progress.get('last_reward'))}")
        parts.append(f"loss {_reward(progress.get('last_loss'))}")
    if timings:
        parts.append(f"elapsed {_duration(progress['elapsed_sec'])}")
        parts.append(f"ETA {_duration(progress['eta_sec'])}")
    return ", ".join(parts)


def _renderable(progress: dict[str, Any]) -> Group:
    train = progress.get("kind") == "train"
    total = (progress.get("steps") or 0) if train else progress["total"]
    completed = progress.get("steps_done", 0) if train else progress["done"]
    header = Text.assemble(
        (str(progress["run"]), "bold"),
        f"  {progress['kind']}  ",
        (str(progress["status"]), "green" if progress["status"] == "succeeded" else "yellow"),
    )
    counts = f"{progress['done']}/{progress['total']} trials done"
    if train:
        counts = f"step {progress['step']}/{progress.get('steps') or '?'}   " + counts
    bar = ProgressBar(total=max(total, 1), completed=completed, width=40)
    stats = Text(
        f"{progress['running']} running   {progress['failed']} failed   "
        f"mean reward {_reward(progress['mean_reward'])}"
        + (f"   last step reward {_reward(progress.get('last_reward'))}" if train else "")
        + (f"   loss {_reward(progress.get('last_loss'))}" if train else "")
    )
    timing = Text(f"elapsed {_duration(progress['elapsed_sec'])}   ETA {_duration(progress['eta_sec'])}", style="dim")
    return Group(header, Text.assemble(counts, "  "), bar, stats, timing)


def progress_fetch(api: Api, run_id: str) -> dict[str, Any]:
    run = api.get(run_path(run_id))
    trials = run_collection(api, run_id, "trials")
    updates = run_collection(api, run_id, "updates") if run.get("kind") == "train" else []
    return progress_of(run=run, trials=trials, updates=updates, now=datetime.now(UTC))


@contextmanager
def _display(ui: Ui) -> Iterator[Any]:
    """A callable that shows one progress: rich live view, plain lines, or JSON lines."""
    if ui.json_mode:
        last: list[Any] = [None]

        def emit_json(progress: dict[str, Any]) -> None:
            key = {k: v for k, v in progress.items() if k not in ("elapsed_sec", "eta_sec")}
            if key != last[0]:
                last[0] = key
                ui.emit_json_line(progress)

        yield emit_json
        return
    if not sys.stdout.isatty():
        shown: list[str | None] = [None]

        def emit_line(progress: dict[str, Any]) -> None:
            # A line per change, not per poll: the timings alone do not make a new line.
            key = progress_line(progress, timings=False)
            if key != shown[0]:
                shown[0] = key
                typer.echo(progress_line(progress))
                sys.stdout.flush()

        yield emit_line
        return
    with Live(console=Console(highlight=False), auto_refresh=False, transient=False) as live:

        def emit_live(progress: dict[str, Any]) -> None:
            live.update(_renderable(progress), refresh=True)

        yield emit_live


def run_watch(*, api: Api, ui: Ui, run_id: str, interval: float) -> None:
    """Show a run's progress until it ends; a CliError unless it succeeded."""
    with _display(ui) as show:
        while True:
            progress = progress_fetch(api, run_id)
            show(progress)
            if progress["status"] in RUN_TERMINAL:
                break
            time.sleep(interval)
    if progress["status"] != "succeeded":
        raise CliError(f"run {run_id} {progress['status']}")
    ui.note(f"run {run_id} succeeded")


IntervalOpt = Annotated[
    float, typer.Option("--interval", min=0.05, help="Seconds between polls of the run's progress.")
]


def watch_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
    interval: IntervalOpt = 2.0,
    json_output: JsonOpt = False,
) -> None:
    """Show a run's live progress until it ends: trials done/total, running, failed, mean
    reward so far, elapsed time and ETA (and the current step for training).

    On a terminal: a live display. Otherwise: one plain line per change. Exit 0 if the
    run succeeded, 1 if it failed or was cancelled.

    --json prints one progress object per change (JSON Lines): {"run", "kind", "status",
    "total", "done", "running", "pending", "failed", "scored", "mean_reward",
    "elapsed_sec", "eta_sec"}, and for training also {"steps", "steps_done", "step",
    "last_reward", "last_loss"}.
    """
    ui = Ui(json_mode=json_output)
    with api_open() as api:
        run_watch(api=api, ui=ui, run_id=run_id, interval=interval)
