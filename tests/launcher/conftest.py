"""Launcher tests need no database; harbor must stay offline (no model-cost map fetch)."""

from __future__ import annotations

import os

# litellm (imported by harbor) fetches a cost map from GitHub unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
