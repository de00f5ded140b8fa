"""The explorer page's screenshot for the docs, from a real model directory.

``python -m experiments.explorer_screenshot --models-dir /tmp/explorer-models --model imdb-minilm
--rho 0.3 --out docs/plots/explorer.png``

Serves ``--models-dir`` with the real service (uvicorn, in this process, on a free loopback port),
opens GET /explorer in Debian's headless chromium (selenium + chromedriver), loads the models, picks
``--model``, pastes ``--text`` (and ``--question`` for QA), runs it at ``--rho`` and saves the page as
PNG. Beside it, ``<out>.json`` holds what the page showed (its request's response: usage, survival
depths; the manifest's curves) with the machine description, and ``<out>.md`` a short table.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._http import free_port, wait_ready
from benchmarks.harness import describe, write_result

DEFAULT_TEXT = (
    "I went in expecting another tired sequel and came out grinning. The plot is thin and the first "
    "twenty minutes drag, but the two leads have real chemistry, the jokes land far more often than "
    "not, and the final chase is the most fun I have had in a cinema this year. Bring friends."
)
DEFAULT_QUESTION = "How did the reviewer feel?"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 120.0
WINDOW = (1280, 900)  # the height grows to the page's


@contextmanager
def live_service(models_dir: Path) -> Iterator[str]:
    """The service over ``models_dir`` behind uvicorn in a thread; yields its base URL once ready."""
    import uvicorn

    from service.api.app import create_app
    from service.settings import Settings

    port = free_port()
    app = create_app(Settings(models_dir=models_dir))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn-explorer", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, WAIT_S, name="the service")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextmanager
def headless_chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def drive_page(driver: Any, url: str, model: str, text: str, question: str, rho: float) -> None:
    """Everything a user does: load the models, pick one, paste, set ρ, run; waits for the answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.1)
    driver.get(f"{url}/explorer")
    driver.find_element(By.ID, "load-models").click()
    wait.until(lambda d: d.find_element(By.ID, "model").is_enabled(), message="the model list")
    Select(driver.find_element(By.ID, "model")).select_by_value(model)
    body = driver.find_element(By.TAG_NAME, "body")
    wait.until(lambda _: body.get_attribute("data-model") == model, message="the model's manifest")
    driver.execute_script(
        "document.getElementById('text').value = arguments[0];"
        "document.getElementById('question').value = arguments[1];"
        "const s = document.getElementById('rho'); s.value = arguments[2];"
        "s.dispatchEvent(new Event('input'));",
        text,
        question,
        str(rho),
    )
    driver.find_element(By.ID, "run").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-runs") == "1")
    error = driver.find_element(By.ID, "error")
    if error.is_displayed():
        raise RuntimeError(f"the page reported an error: {error.text}")


def page_numbers(driver: Any) -> dict[str, Any]:
    """What the page showed: its request's response and ρ, and the model's manifest curves."""
    shown: dict[str, Any] = driver.execute_script(
        "const s = window.explorer.state;"
        "return {task: s.last.task, rho: s.last.rho, response: s.last.body, round_trip_ms: s.last.roundTrip,"
        " quality: s.manifest.quality, speed: s.manifest.speed, schedule: s.manifest.schedule};"
    )
    return shown


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--model", required=True, help="served model name (must have survival depth)")
    parser.add_argument("--rho", type=float, default=0.3)
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--question", default=DEFAULT_QUESTION, help="QA models only")
    parser.add_argument("--out", type=Path, default=Path("docs/plots/explorer.png"))
    args = parser.parse_args(argv)

    with live_service(args.models_dir) as url, headless_chromium() as driver:
        drive_page(driver, url, args.model, args.text, args.question, args.rho)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # the window's height is the page's plus whatever the browser keeps for itself
        height = driver.execute_script(
            "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
        )
        driver.set_window_size(WINDOW[0], int(height) + 16)
        driver.save_screenshot(str(args.out))
        numbers = page_numbers(driver)
    usage = numbers["response"]["usage"]
    payload = {
        "command": "experiments.explorer_screenshot",
        "model": args.model,
        "models_dir": str(args.models_dir),
        "text": args.text,
        "question": args.question if numbers["task"] == "qa" else None,
        **numbers,
        "machine": describe(),
    }
    table = (
        f"| model | task | rho | token-work | kept per layer |\n|---|---|---|---|---|\n"
        f"| {args.model} | {numbers['task']} | {usage['rho_effective']} | {usage['token_work_fraction']:.3f} "
        f"| {' → '.join(map(str, usage['kept_tokens_per_layer']))} |\n"
    )
    write_result(args.out.with_suffix(".json"), payload, table)
    print(json.dumps({"screenshot": str(args.out), "token_work_fraction": usage["token_work_fraction"]}))


if __name__ == "__main__":
    main()
