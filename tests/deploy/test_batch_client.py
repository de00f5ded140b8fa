"""The batch client against a scripted loopback server: order, retries, field mapping, resume."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clients import batch
from tests.deploy.conftest import REPO
from tests.deploy.stub_server import THROTTLE_TIMES, StubServer
from tests.service.conftest import models_root, served, settings_for, tiny_models  # noqa: F401

pytestmark = pytest.mark.integration  # the batch client as a subprocess


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_jsonl_in_order_with_retries_and_errors(tmp_path: Path, stub_server: StubServer) -> None:
    texts = [f"sleep:{0.05 * (i % 3)}:row {i}" for i in range(30)]
    texts[4] = "throttle:row 4"
    texts[7] = "invalid:row 7"
    texts[11] = "flaky:row 11"
    write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "review": t} for i, t in enumerate(texts)])
    summary_path = tmp_path / "summary.json"
    code = batch.main(
        [
            str(tmp_path / "in.jsonl"),
            str(tmp_path / "out.jsonl"),
            "--url",
            stub_server.url,
            "--rho",
            "0.5",
            "--concurrency",
            "4",
            "--field",
            "text=review",
            "--id-field",
            "id",
            "--api-key",
            "secret",
            "--no-progress",
            "--summary-json",
            str(summary_path),
        ]
    )
    assert code == 1  # one row failed (422)
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["index"] for r in out] == list(range(30))
    assert [r["id"] for r in out] == [f"r{i}" for i in range(30)]
    assert out[7]["ok"] is False and out[7]["status"] == 422
    assert out[4]["ok"] is True and out[4]["attempts"] == THROTTLE_TIMES + 1
    assert out[11]["ok"] is True and out[11]["attempts"] == 2
    assert all(r["response"]["echo"] == texts[r["index"]] for r in out if r["ok"])
    state = stub_server.state
    assert state.max_in_flight <= 4
    assert all(q["rho"] == ["0.5"] for q in state.queries)
    assert all(h.get("Authorization") == "Bearer secret" for h in state.headers)
    assert sum(state.answered.values()) == 29  # every good row answered exactly once
    summary = json.loads(summary_path.read_text())
    assert summary["rows"] == 30 and summary["ok"] == 29 and summary["errors"] == 1
    assert summary["throttled"] == THROTTLE_TIMES and summary["retries"] == THROTTLE_TIMES + 1
    assert summary["token_work_saved"] == pytest.approx(0.25)  # (1 + rho) / 2 work at rho 0.5
    assert not (tmp_path / "out.jsonl.pending.jsonl").exists()


def test_csv_qa_mapping_and_constants(tmp_path: Path, stub_server: StubServer) -> None:
    with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["q", "passage"])
        for i in range(5):
            w.writerow([f"who is {i}?", f"{i} is, a number"])
    code = batch.main(
        [
            str(tmp_path / "in.csv"),
            str(tmp_path / "out.jsonl"),
            "--url",
            stub_server.url,
            "--endpoint",
            "qa",
            "--field",
            "question=q",
            "--field",
            "context=passage",
            "--const",
            "top_k=2",
            "--api-key",
            "k",
            "--api-key-header",
            "X-API-Key",
            "--no-progress",
        ]
    )
    assert code == 0
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["response"]["echo"] for r in out] == [f"who is {i}?" for i in range(5)]
    bodies = sorted(stub_server.state.bodies, key=lambda b: b["question"])
    assert bodies[0] == {"question": "who is 0?", "context": "0 is, a number", "top_k": 2}
    assert all(h.get("X-API-Key") == "k" for h in stub_server.state.headers)
    assert all("rho" not in q for q in stub_server.state.queries)


def test_missing_column_is_a_row_error(tmp_path: Path, stub_server: StubServer) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "fine"}, {"other": "no text"}])
    code = batch.main(
        [str(tmp_path / "in.jsonl"), str(tmp_path / "o.jsonl"), "--url", stub_server.url, "--no-progress"]
    )
    assert code == 1
    out = read_jsonl(tmp_path / "o.jsonl")
    assert out[0]["ok"] and not out[1]["ok"] and "no column" in out[1]["error"]


def test_torn_last_line_is_cut_on_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"index": 0, "ok": true}\n{"index": 1, "ok": true}\n{"index": 2, "o', encoding="utf-8")
    journal = tmp_path / "out.jsonl.pending.jsonl"
    journal.write_text('{"index": 1, "ok": true}\n{"index": 5, "ok": true}\n{"inde', encoding="utf-8")
    done, recovered = batch.load_resume_state(out, journal)
    assert done == 2 and set(recovered) == {5}
    assert out.read_text(encoding="utf-8").endswith("}\n")


def test_retry_after_parsing() -> None:
    assert batch.retry_after_seconds("3") == 3.0
    assert batch.retry_after_seconds("0.5") == 0.5
    assert batch.retry_after_seconds(None) is None
    assert batch.retry_after_seconds("garbage") is None
    http_date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < (batch.retry_after_seconds(http_date) or 0) <= 31


def _finished(out: Path, journal: Path) -> set[int]:
    done = {r["index"] for r in read_jsonl(out)} if out.exists() else set()
    if journal.exists():
        for line in journal.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError):
                done.add(json.loads(line)["index"])
    return done


def test_interrupted_run_resumes_without_redoing_rows(tmp_path: Path, stub_server: StubServer) -> None:
    """SIGTERM mid-run (one row hangs, later rows finish out of order), then rerun the command."""
    n = 40
    texts = [f"row {i}" for i in range(n)]
    texts[10] = "block:row 10"
    write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    out, journal = tmp_path / "out.jsonl", tmp_path / "out.jsonl.pending.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "clients.batch",
        str(tmp_path / "in.jsonl"),
        str(out),
        "--url",
        stub_server.url,
        "--concurrency",
        "3",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while len(_finished(out, journal)) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_finished(out, journal)) >= 20, "client made no progress"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 130, stderr.decode()
    assert b"interrupted" in stderr
    finished_first = _finished(out, journal)
    assert 10 not in finished_first
    assert len(read_jsonl(out)) == 10 and journal.exists()  # rows after the hung one wait in the journal

    answered_first = dict(stub_server.state.answered)
    stub_server.state.release.set()
    second = subprocess.run([*cmd, "--no-progress"], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert second.returncode == 0, second.stderr.decode()
    redone = {
        i
        for i, t in enumerate(texts)
        if stub_server.state.answered[t] > answered_first.get(t, 0) and i in finished_first
    }
    assert redone == set(), f"finished rows sent again: {sorted(redone)}"
    final = read_jsonl(out)
    assert [r["index"] for r in final] == list(range(n))
    assert [r["response"]["echo"] for r in final] == texts
    assert not journal.exists()
    assert f"resumed {len(finished_first)}" in second.stderr.decode()


def test_embed_rows_through_the_real_service(tmp_path: Path, models_root: Path) -> None:  # noqa: F811
    """``--endpoint embed``: each row's vector is the one POST /embed gives for its text."""
    texts = ["the film was a delight", "a long and tedious plot", "short"]
    write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    files = [str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")]
    with served(settings_for(models_root)) as url:
        # --concurrency 1: one row a batch, as the direct requests (a row batched with another can
        # differ in the last float32 bit: docs/deploy.md, "Bit equality")
        options = ["--url", url, "--endpoint", "embed", "--concurrency", "1", "--id-field", "id"]
        code = batch.main([*files, *options, "--no-progress"])
        direct = [httpx.post(f"{url}/embed", json={"text": t}, timeout=30).json() for t in texts]
    assert code == 0
    out = read_jsonl(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [0, 1, 2]
    assert [r["response"]["embedding"] for r in out] == [d["embedding"] for d in direct]
    assert all(r["response"]["usage"]["input_tokens"] > 0 for r in out)
