"""A database that refuses connections is an overload (529, retry), never a 500."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError

from apps.proxy import views

pytestmark = pytest.mark.django_db


def test_database_refusal_is_an_overloaded_error():
    resp = views._reject(OperationalError("FATAL: sorry, too many clients already"), "req_1")
    assert resp.status_code == 529
    body = json.loads(resp.content)
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert resp["retry-after"] == "2"
