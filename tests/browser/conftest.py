"""A real gateway (gunicorn, DEBUG off, static files collected and served by whitenoise)
against the test database, and headless Chromium driven by selenium.

Chromium and chromedriver are Debian's packages, installed by deploy/setup.sh.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Screenshots for the docs are written here when it is set (docs/img in the repository).
SCREENSHOT_DIR = os.environ.get("SYNTH_SCREENSHOT_DIR")


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def static_root() -> Iterator[Path]:
    """The static files, collected once per session as deploy/embedded.sh and the image do."""
    root = Path(tempfile.mkdtemp(prefix="synth-static-"))
    env = {**os.environ, "SYNTH_STATIC_ROOT": str(root), "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def gateway(transactional_db, static_root) -> Iterator[Gateway]:
    """gunicorn on the test database: what the browser sees is what a deployment serves."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.test_settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SYNTH_VAR_DIR": str(settings.VAR_DIR),  # the same object store and secret key
        "SYNTH_STATIC_ROOT": str(static_root),
        "SYNTH_DEBUG": "false",
        "PYTHONPATH": str(ROOT),
    }
    port = _free_port()
    gunicorn = Path(sys.executable).with_name("gunicorn")
    process = subprocess.Popen(
        [str(gunicorn), "synth_project.wsgi", "-c", "deploy/gunicorn.conf.py", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=2).read()
                break
            except OSError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = process.stderr.read().decode()[-2000:] if process.poll() is not None else ""  # type: ignore[union-attr]
                    raise RuntimeError(f"the gateway did not start: {log}") from exc
                time.sleep(0.2)
        yield Gateway(url=url, process=process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def browser(tmp_path) -> Iterator[object]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        # A missing browser is a broken set-up, not a reason to pass without checking the pages.
        pytest.fail("chromium and chromium-driver are not installed (deploy/setup.sh installs them as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the suite runs as root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(element: object, name: str) -> None:
    """Save a PNG for the docs when SYNTH_SCREENSHOT_DIR is set (an element or the window)."""
    if not SCREENSHOT_DIR:
        return
    Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
    element.screenshot(str(Path(SCREENSHOT_DIR) / name))  # type: ignore[attr-defined]
