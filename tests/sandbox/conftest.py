"""Local sandbox tests: real sandboxes, no database (see helpers.py)."""

from __future__ import annotations

import os

# Keep Harbor/litellm offline (no model-cost-map download).
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
