"""Log folding for the server's modules: the filters live in the Django-free
synth_common.logfold, which the sandbox's model bridge uses as well."""

from __future__ import annotations

from synth_common.logfold import ErrorResponseFolder, RepeatFolder

__all__ = ["ErrorResponseFolder", "RepeatFolder"]
