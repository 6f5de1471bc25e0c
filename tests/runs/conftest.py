from __future__ import annotations

from typing import Any

import pytest

from tests.factories import make_dataset_version, make_profile_version


@pytest.fixture
def inputs(alice) -> dict[str, Any]:
    """A dataset version and an actor profile version of alice's org, and a valid body."""
    dsv = make_dataset_version(org=alice.org)
    actor = make_profile_version(org=alice.org)
    body = {
        "kind": "evaluate",
        "dataset": dsv.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "judge": None,
        "plan": {"attempts_per_task": 2},
    }
    return {"dataset_version": dsv, "actor": actor, "body": body}
