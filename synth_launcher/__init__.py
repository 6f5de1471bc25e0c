"""The recipe launcher: what one attempt runs, for every engine, without Django.

* launcher.py: a recipe and its bindings (run, task, attempt, model) -> a LaunchPlan (argv, env,
  files, required outputs), deterministic and digest-addressed.
* harbor_agent.py: the Harbor agent (RecipeAgent) that executes a LaunchPlan in a sandbox.
* mini_agent.py: synth-mini, the built-in minimal agent uploaded into sandboxes (Python 3.9,
  standard library only).

Imported by the trial host (apps.trials) and by the CLI (`synth agent run`).
"""
