"""Fixtures for the browser tests: Debian's headless chromium driven by selenium through Debian's
chromedriver (``apt-get install chromium chromium-driver``; CI installs them), against the real service
behind uvicorn, with the tiny exported models of the service tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.service.conftest import tiny_models

__all__ = ["browser", "tiny_models"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless chromium for the session, its console kept (``get_log("browser")``)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if missing:  # a failure, not a skip: the browser tests are part of the suite
        raise RuntimeError(f"{missing} not installed: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1400"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def model_root(tiny_models: dict[str, Path], root: Path, tasks: tuple[str, ...]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        shutil.copytree(tiny_models[task], root / f"tiny-{task}")
    return root
