"""Why a task, a registry or an archive is refused: the user-facing message names the file."""

from __future__ import annotations


class TaskFormatError(ValueError):
    """A task (or registry) that Harbor would not accept; str() is the user-facing message."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem

    def __reduce__(self) -> tuple[type[TaskFormatError], tuple[str, str]]:
        # Raised in a parse worker process and re-raised in the request's (pickled).
        return (type(self), (self.where, self.problem))
