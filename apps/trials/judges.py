"""Judges: an agent that assesses an attempt in place of (or beside) the task's tests.

A run's judge is a pinned profile version (``RunSpec.judge_version``), a recipe like any
actor's: an engine (synth-mini, claude-code, command ...) and usually a model binding of
its own. When a run has one, each trial's verification is ``JudgeVerifier``, a Harbor
verifier (``VerifierConfig.import_path``) that runs the judge's launch plan in the same
sandbox after the actor finished, through the same launcher and RecipeAgent, with:

* the instruction below (the task's own instruction quoted inside it);
* its files under ``/logs/verifier/judge`` (its plan, transcript, exit code), so the
  actor's logs stay as the actor left them;
* its own model credential (``role="judge"``): its calls are captured, and never count as
  the attempt's (training ignores them).

The judge's verdict is what a task's tests would give: ``/logs/verifier/reward.txt`` (a
number) or ``reward.json`` (named numbers), parsed by Harbor's own rules. No verdict is a
``RewardFileNotFoundError``, like a test script that wrote none.
"""

from __future__ import annotations

from typing import Any

from harbor.models.agent.context import AgentContext
from harbor.models.trial.paths import EnvironmentPaths
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.verifier import RewardFileNotFoundError, Verifier

from synth_launcher.harbor_agent import CREDENTIAL_ENV, RecipeAgent

JUDGE_LOGS_DIR = "/logs/verifier/judge"
IMPORT_PATH = "apps.trials.judges:JudgeVerifier"

JUDGE_INSTRUCTION = """\
You are the judge of an attempt at the task quoted below. The attempt is over: its work is \
in {workdir}, as the agent left it. Inspect it (read files, run commands, run its tests); \
do not change it. Then decide how well the attempt accomplishes the task, from 0 (not at \
all) to 1 (completely), and write ONLY that number to /logs/verifier/reward.txt (or a JSON \
object of named scores with a "reward" key to /logs/verifier/reward.json).

<task>
{instruction}
</task>
"""


def judge_instruction(*, instruction: str, workdir: str) -> str:
    return JUDGE_INSTRUCTION.format(instruction=instruction.strip(), workdir=workdir)


class JudgeVerifier(Verifier):
    """Harbor verifier that runs a judge's launch plan and reads its verdict."""

    def __init__(self, *, launch_plan: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._launch_plan = launch_plan

    async def verify(self) -> VerifierResult:
        await self._remove_reward_files()
        credential = self.override_env.get(CREDENTIAL_ENV)
        logs = self.trial_paths.verifier_dir / "judge"
        logs.mkdir(parents=True, exist_ok=True)
        judge = RecipeAgent(
            logs_dir=logs,
            launch_plan=self._launch_plan,
            extra_env={CREDENTIAL_ENV: credential} if credential else None,
            logger=self.logger,
        )
        await judge.setup(self.environment)
        context = AgentContext()
        await judge.run(judge.plan.instruction, self.environment, context)
        env_paths = EnvironmentPaths.for_os(self.environment.os)
        if not self.environment.is_path_mounted(env_paths.verifier_dir, self.trial_paths.verifier_dir):
            await self.environment.download_dir(
                source_dir=str(env_paths.verifier_dir), target_dir=self.trial_paths.verifier_dir
            )
        if self.trial_paths.reward_json_path.exists():
            return VerifierResult(rewards=self._parse_reward_json())
        if self.trial_paths.reward_text_path.exists():
            return VerifierResult(rewards=self._parse_reward_text())
        raise RewardFileNotFoundError(
            f"the judge ({judge.plan.engine}, exit code {context.metadata.get('exit_code')}) wrote no verdict to "
            f"/logs/verifier/reward.txt or reward.json"
        )
