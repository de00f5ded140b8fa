"""Every program that sends a request body builds it from the task's face (``TaskFace.example_body``, or
the input fields ``GET /models`` lists), never from a table or an if-chain of its own: a task on the list
(a test package too) is then sent valid bodies by all of them with no edit.

Checked twice: each face's example body is one its route accepts (for every task on the list, the tests'
toys included), and a static scan of the body-building consumers finds no body written by hand (a dict
literal whose keys are all fields of a task's request body) and no branch on a task's name; the scan
itself is shown to catch the if-chain ``benchmarks/load.py``'s ``payload()`` used to be.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from benchmarks.load import payload
from retention_core.tasks import TASKS
from service.api.faces import FACES
from service.api.schemas import ExplainOptions
from tests.task_packages import PARITY, RERANK, listed

REPO = Path(__file__).resolve().parents[2]
# The programs that send request bodies (their body-building functions)
CONSUMERS = (
    "benchmarks/load.py",
    "benchmarks/overload.py",
    "benchmarks/overload_locust.py",
    "scripts/image_test.py",
    "clients/batch.py",
    "clients/records.py",
    "clients/ray_batch.py",
)
# Functions that send one route's body on purpose, not a task's: the image test's drain check holds a slow
# 64-text /classify request in flight while the container is stopped.
DELIBERATE = {"image_test.py:check_drain"}
# Keyword arguments whose dicts are not bodies (a Prometheus query's params: its "query" is no reranker's).
NOT_BODIES = {"params", "headers"}
EXPLORER = REPO / "service" / "static" / "explorer.js"
TEXT = "the model reads every token and keeps the salient ones and the budget decides"


def body_fields() -> list[frozenset[str]]:
    """Each face's own request fields (the options every body may carry left out)."""
    shared = set(ExplainOptions.model_fields)
    return [frozenset(face.request.model_fields) - shared for face in FACES.values()]


def hand_written_bodies(path: Path, tasks: set[str], bodies: list[frozenset[str]]) -> list[str]:
    """``path:line`` of every dict literal whose string keys are all fields of one task's request body,
    and of every comparison with a task's name (``task == "qa"``, ``task in ("qa", ...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped: set[int] = set()  # ids of the nodes of deliberate functions and of non-body arguments
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and f"{path.name}:{node.name}" in DELIBERATE:
            skipped.update(id(inner) for inner in ast.walk(node))
        elif isinstance(node, ast.keyword) and node.arg in NOT_BODIES:
            skipped.add(id(node.value))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Dict) and node.keys:
            keys = {str(key.value) for key in node.keys if isinstance(key, ast.Constant)}
            if len(keys) == len(node.keys) and any(keys <= fields for fields in bodies):
                found.append(f"{path.name}:{node.lineno} writes a body {sorted(keys)}")
        elif isinstance(node, ast.Compare):
            named = {
                constant.value
                for operand in (node.left, *node.comparators)
                for constant in ast.walk(operand)
                if isinstance(constant, ast.Constant) and constant.value in tasks
            }
            if named:
                found.append(f"{path.name}:{node.lineno} branches on {sorted(named)}")
    return found


def explorer_hand_written(source: str, tasks: set[str], bodies: list[frozenset[str]]) -> list[str]:
    """The explorer page's ``requestBody``: no task name, no body field written as an object key."""
    match = re.search(r"\nfunction requestBody\(.*?\n}\n", source, re.S)
    assert match, "explorer.js has no requestBody function"
    body = match.group(0)
    fields = set().union(*bodies)
    named = [task for task in sorted(tasks) if f'"{task}"' in body]
    keys = [name for name in sorted(fields) if re.search(rf"[{{,]\s*{name}\s*[:,}}]", body)]
    return [f"requestBody names {name}" for name in (*named, *keys)]


def test_every_face_example_is_a_body_its_route_accepts() -> None:
    """``payload`` (the load benchmarks') for every task on the list, the tests' toys included."""
    with listed(PARITY, RERANK):
        assert {"toy_parity", "toy_rerank"} <= set(FACES)
        for task, face in FACES.items():
            body = payload(task, TEXT)
            face.request.model_validate(body)  # a ValidationError names the task's field at fault
            assert face.count(face.request.model_validate(body)) >= 1, task


def test_no_consumer_writes_a_body_of_its_own() -> None:
    with listed(PARITY, RERANK):
        tasks, bodies = set(TASKS), body_fields()
        found = [line for name in CONSUMERS for line in hand_written_bodies(REPO / name, tasks, bodies)]
        found += explorer_hand_written(EXPLORER.read_text(encoding="utf-8"), tasks, bodies)
    assert found == []


PLANTED = """
def payload(task, text):
    if task == "qa":
        return {"question": "what does the model keep?", "context": text}
    if task == "summarization":
        return {"text": text.replace(" and ", ". And "), "max_sentences": 2}
    return {"text": text}
"""
PLANTED_JS = """
function requestBody(task, rho) {
  const text = $("text").value;
  if (task === "qa") return { question: $("question").value, context: text, rho, explain: true };
  return { text, rho, explain: true };
}
"""


def test_the_scan_catches_a_planted_if_chain(tmp_path: Path) -> None:
    """The check itself: the if-chain ``payload()`` was (a reranker would have been sent ``{"text"}`` and
    refused), and the explorer's old per-task body, are both found."""
    planted = tmp_path / "load.py"
    planted.write_text(PLANTED, encoding="utf-8")
    tasks, bodies = set(TASKS), body_fields()
    assert sorted(hand_written_bodies(planted, tasks, bodies)) == [
        "load.py:3 branches on ['qa']",
        "load.py:4 writes a body ['context', 'question']",
        "load.py:5 branches on ['summarization']",
        "load.py:6 writes a body ['max_sentences', 'text']",
        "load.py:7 writes a body ['text']",
    ]
    assert explorer_hand_written(PLANTED_JS, tasks, bodies) == [
        "requestBody names qa",
        "requestBody names context",
        "requestBody names question",
        "requestBody names text",
    ]


@pytest.mark.parametrize("task", ["classification", "qa", "summarization", "embedding"])
def test_the_shipped_example_bodies_are_unchanged(task: str) -> None:
    """The bodies the load benchmarks sent before they were the faces' (same numbers)."""
    before = {
        "classification": {"text": TEXT},
        "embedding": {"text": TEXT},
        "qa": {"question": "what does the model keep?", "context": TEXT},
        "summarization": {"text": TEXT.replace(" and ", ". And "), "max_sentences": 2},
    }
    assert payload(task, TEXT) == before[task]
