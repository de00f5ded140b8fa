"""The explorer page (GET /explorer) in a real headless chromium against the live service: it loads
without console errors, a request at two ρ values changes the shading and the reported token-work, and
401 / 422 / 429 come back as messages on the page."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from service.api.app import create_app
from tests.browser.conftest import model_root
from tests.service.conftest import blocked_inference, served, settings_for
from tests.service.test_explain import LONG_TEXT, strip_survival_depth

pytestmark = pytest.mark.integration  # headless chromium

API_KEY = "explorer-s3cret"
LAYERS = 2  # training.tiny.TINY_LAYERS
WAIT_S = 60  # generous: a shared 2-core machine


@pytest.fixture(scope="module")
def live(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FastAPI, str]]:
    """The service with an API key and one request at a time, serving tiny classification and QA models
    and a classification model exported before survival depth existed."""
    root = model_root(tiny_models, tmp_path_factory.mktemp("explorer-models"), ("classification", "qa"))
    shutil.copytree(tiny_models["classification"], root / "old-export")
    strip_survival_depth(root / "old-export")
    # The copy keeps the tiny model's manifest name: rename it so both load.
    manifest = root / "old-export" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"name": "tiny-classification"', '"name": "old-export"'))
    app = create_app(settings_for(root, api_key=API_KEY, max_concurrent_requests=1))
    with served(app=app) as url:
        yield app, url


def wait_for(driver: webdriver.Chrome, condition: Callable[[Any], Any], what: str) -> Any:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition, message=f"waiting for {what}")


def severe_console_entries(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def runs(driver: webdriver.Chrome) -> int:
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-runs") or 0)


def open_page(driver: webdriver.Chrome, url: str, key: str = API_KEY) -> None:
    driver.get(f"{url}/explorer")
    driver.get_log("browser")  # start from this page's own entries
    field = driver.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "load-models").click()


def choose_model(driver: webdriver.Chrome, name: str) -> None:
    wait_for(driver, lambda d: d.find_element(By.ID, "model").is_enabled(), "the model list")
    Select(driver.find_element(By.ID, "model")).select_by_value(name)
    body = driver.find_element(By.TAG_NAME, "body")
    wait_for(driver, lambda _: body.get_attribute("data-model") == name, "the model's manifest")
    assert driver.find_element(By.ID, "run").is_enabled()


def set_rho(driver: webdriver.Chrome, rho: float) -> None:
    """Move the slider as a user does: the value, then its input and change events."""
    driver.execute_script(
        "const s = document.getElementById('rho'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change'));",
        str(rho),
    )


def run_and_wait(driver: webdriver.Chrome, start: Callable[[], None]) -> None:
    before = runs(driver)
    start()
    wait_for(driver, lambda d: runs(d) > before, "the request to finish")


def shading(driver: webdriver.Chrome, container: str = "shaded") -> list[int]:
    spans = driver.find_elements(By.CSS_SELECTOR, f"#{container} .tok")
    return [int(span.get_attribute("data-depth") or -1) for span in spans]


def token_work(driver: webdriver.Chrome) -> float:
    return float(driver.find_element(By.ID, "usage").get_attribute("data-token-work") or "nan")


def error_text(driver: webdriver.Chrome) -> str:
    box = driver.find_element(By.ID, "error")
    return box.text if box.is_displayed() else ""


def test_page_is_served_without_the_key_and_the_api_needs_it(live: tuple[FastAPI, str]) -> None:
    _, url = live
    page = httpx.get(f"{url}/explorer", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for asset in ("explorer.js", "explorer.css"):
        assert httpx.get(f"{url}/explorer/{asset}", timeout=10).status_code == 200
    assert httpx.get(f"{url}/explorer/..%2Fapp.py", timeout=10).status_code == 404
    assert httpx.get(f"{url}/models", timeout=10).status_code == 401


def test_two_rhos_change_the_shading_and_the_token_work(
    browser: webdriver.Chrome, live: tuple[FastAPI, str]
) -> None:
    _, url = live
    open_page(browser, url)
    choose_model(browser, "tiny-classification")
    options = {
        o.get_attribute("value"): o.is_enabled()
        for o in browser.find_elements(By.CSS_SELECTOR, "#model option")
    }
    assert options == {"tiny-classification": True, "tiny-qa": True, "old-export": False}  # no depth: off
    assert not browser.find_element(By.ID, "question").is_displayed()  # QA only
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys(LONG_TEXT)

    set_rho(browser, 1.0)
    run_and_wait(browser, browser.find_element(By.ID, "run").click)
    dense_depths, dense_work = shading(browser), token_work(browser)
    assert dense_depths and set(dense_depths) == {LAYERS}  # ρ = 1 keeps every token in every layer

    run_and_wait(browser, lambda: set_rho(browser, 0.2))  # moving the slider re-runs the request
    pruned_depths, pruned_work = shading(browser), token_work(browser)
    assert len(pruned_depths) == len(dense_depths)  # the same tokens, shaded differently
    assert min(pruned_depths) < LAYERS and pruned_depths != dense_depths
    assert pruned_work < dense_work
    assert "saved" in browser.find_element(By.ID, "usage").text
    # the token-work curve comes from the server (GET /models/{name}/schedule), one dot per rho of its grid
    wait_for(
        browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#work-chart circle.dot")) == 20, "the curve"
    )
    marker = browser.find_element(By.CSS_SELECTOR, "#work-chart line.marker")
    assert float(marker.get_attribute("data-rho") or 0) == pytest.approx(0.2)
    assert browser.find_elements(By.CSS_SELECTOR, "#work-chart circle.measured")
    assert error_text(browser) == ""
    assert severe_console_entries(browser) == []


def test_qa_shades_question_and_context(browser: webdriver.Chrome, live: tuple[FastAPI, str]) -> None:
    _, url = live
    open_page(browser, url)
    choose_model(browser, "tiny-qa")
    assert browser.find_element(By.ID, "question").is_displayed()
    set_rho(browser, 0.2)
    run_and_wait(browser, browser.find_element(By.ID, "run").click)
    question = shading(browser, "question-shaded")
    assert question and set(question) == {LAYERS}  # protected: the question is never dropped
    assert shading(browser)  # the context
    assert browser.find_element(By.ID, "result").text
    assert severe_console_entries(browser) == []


def test_wrong_key_and_empty_text_are_shown(browser: webdriver.Chrome, live: tuple[FastAPI, str]) -> None:
    _, url = live
    open_page(browser, url, key="not-the-key")
    wait_for(browser, lambda d: "401" in error_text(d), "the 401 message")
    assert "API key" in error_text(browser)

    open_page(browser, url)
    choose_model(browser, "tiny-classification")
    browser.find_element(By.ID, "text").clear()
    run_and_wait(browser, browser.find_element(By.ID, "run").click)
    assert "422" in error_text(browser)


def test_overload_is_shown_with_its_retry_time(browser: webdriver.Chrome, live: tuple[FastAPI, str]) -> None:
    app, url = live
    open_page(browser, url)
    choose_model(browser, "tiny-classification")
    with blocked_inference(app, "tiny-classification"):
        # One request holds the server's only slot (max_concurrent_requests=1) until the block lifts.
        answers: list[httpx.Response] = []
        holder = threading.Thread(
            target=lambda: answers.append(
                httpx.post(
                    f"{url}/classify?model=tiny-classification",
                    json={"text": "hold the slot"},
                    headers={"Authorization": f"Bearer {API_KEY}"},
                    timeout=60,
                )
            )
        )
        holder.start()
        server = app.state.server
        wait_for(browser, lambda _: server._in_flight == 1 or answers, "the slot to be taken")
        assert not answers, answers[0].text
        run_and_wait(browser, browser.find_element(By.ID, "run").click)
    holder.join(timeout=60)
    message = error_text(browser)
    assert "429" in message and "Retry in 1 s" in message


def test_the_package_ships_the_page() -> None:
    """A non-editable install carries service/static only if pyproject's package data names the files."""
    import fnmatch
    import tomllib

    from service.api.routers.explorer import ASSETS

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["service"]
    for name in ASSETS:
        assert (root / "service" / "static" / name).is_file()
        assert any(fnmatch.fnmatch(f"static/{name}", pattern) for pattern in patterns), name
