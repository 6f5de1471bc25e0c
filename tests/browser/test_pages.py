"""Admin and API documentation pages in a real browser: styled, with their chart and their
operations, served the way a deployment serves them (DEBUG off)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import screenshot
from tests.browser.scenes import CURVE, make_train_scene

pytestmark = pytest.mark.slow

PASSWORD = "a-long-test-password"


def _log_in(browser, gateway) -> None:
    get_user_model().objects.create_superuser("operator", "operator@example.com", PASSWORD)
    browser.get(f"{gateway.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The login page has a #site-name too: wait for what only a signed-in page has.
    WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "user-tools")))


def _style(browser, selector: str, prop: str) -> str:
    return browser.execute_script(
        "return getComputedStyle(document.querySelector(arguments[0])).getPropertyValue(arguments[1]);",
        selector,
        prop,
    )


def test_admin_pages_load_with_their_stylesheet(browser, gateway):
    browser.get(f"{gateway.url}/admin/login/")
    # base.css colours the header (#417690) and sets its flex layout; unstyled, it is a
    # transparent block.
    assert _style(browser, "#header", "background-color") == "rgb(65, 118, 144)"
    assert _style(browser, "#header", "display") == "flex"
    _log_in(browser, gateway)
    assert browser.find_element(By.ID, "site-name").text == "Synth operations"
    assert _style(browser, "#header", "background-color") == "rgb(65, 118, 144)"


def test_a_train_runs_page_draws_its_chart(browser, gateway, alice):
    scene = make_train_scene(org=alice.org)
    _log_in(browser, gateway)
    browser.get(f"{gateway.url}/admin/runs/run/{scene.run.id}/change/")
    chart = WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.synth-chart")))
    points = chart.find_elements(By.CSS_SELECTOR, "circle.synth-point")
    drawn = sorted(
        (p.get_attribute("data-series"), float(p.get_attribute("data-x")), float(p.get_attribute("data-y")))
        for p in points
    )
    expected = sorted([("reward", s, r) for s, r, _ in CURVE] + [("loss", s, loss) for s, _, loss in CURVE])
    assert drawn == expected
    # Rendered, not only present: the SVG has a size and its points lie inside it.
    box = chart.rect
    assert box["width"] > 300 and box["height"] > 100
    for p in points:
        assert box["x"] <= p.rect["x"] <= box["x"] + box["width"]
    assert browser.find_element(By.ID, "run-progress").text == "3 / 4"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#run-tasks tbody tr")) == 2
    screenshot(browser.find_element(By.ID, "run-overview"), "run-page.png")
    screenshot(browser.find_element(By.ID, "learning-chart"), "run-chart.png")


def test_the_api_docs_list_the_operations(browser, gateway):
    browser.get(f"{gateway.url}/api/docs/")
    wait = WebDriverWait(browser, 30)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock-summary-path")))
    paths = {e.text.replace("\u200b", "") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/events"} <= paths
    assert len(browser.find_elements(By.CSS_SELECTOR, ".opblock")) >= 20


def test_redoc_renders_the_schema(browser, gateway):
    browser.get(f"{gateway.url}/api/redoc/")
    WebDriverWait(browser, 30).until(
        lambda b: b.execute_script("return document.querySelectorAll('[data-section-id]').length") > 10
    )
    assert "Synth API" in browser.find_element(By.TAG_NAME, "h1").text
