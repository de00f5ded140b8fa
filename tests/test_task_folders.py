"""A task is one folder, in code too: for each shipped task, the product files outside its package that
name it as a code token (an identifier, or a string literal that is exactly the name; comments and prose
do not count) are exactly the few listed here, each with its reason. What only one task uses lives in
``retention_tasks/<task>/``; a new file naming a task, or a listed one that no longer does, fails here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from retention_core.tasks import SHIPPED_TASKS

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("retention_core", "retention_torch", "retention_ort", "training", "service", "clients")
PAGES = (".js", ".html")  # the explorer page, read as code too (its comments left out)

# task → {file naming it outside the task's folder: why it may}
ALLOWED: dict[str, dict[str, str]] = {
    "classification": {
        "training/recipes/recipe.py": "a recipe's default task (Recipe.task)",
        "training/tiny.py": "the tiny models' default task",
        "training/fitting/hf_checkpoint.py": "to-hf: a classification run as a Hugging Face classifier",
    },
    "qa": {},
    "summarization": {},
    "embedding": {
        "retention_core/contract.py": "the manifest's pooled-head record (Manifest.embedding)",
        "training/export/manifest.py": "writes Manifest.embedding",
        "service/runtime.py": "reads Manifest.embedding (the vector size /v1/embeddings promises)",
        "service/backends/torch_backend.py": "reads Manifest.embedding (the pooling)",
        "training/__main__.py": "retrofit's default --task",
        "service/api/faces.py": "the task OpenAI's and TEI's embeddings APIs serve (EMBEDDING), shared",
        "service/api/schemas.py": "the embedding bodies, which TEI's /embed reads too",
        "service/api/routers/openai_compat.py": "OpenAI's /v1/embeddings serves the embedding task",
        "service/api/routers/tei_compat.py": "TEI's API serves the embedding task",
    },
}


def python_names(path: Path, names: set[str]) -> set[str]:
    """Those of ``names`` that ``path`` uses as an identifier or as a whole string literal."""
    found = set()
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.NAME and token.string in names:
            found.add(token.string)
        elif token.type == tokenize.STRING:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):  # an f-string
                continue
            if isinstance(value, str) and value in names:
                found.add(value)
    return found


def page_names(path: Path, names: set[str]) -> set[str]:
    """Those of ``names`` that a page's code (its ``//`` and ``/* */`` comments left out) holds as a word."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*|<!--.*?-->", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {name for name in names if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)}


def naming_files() -> dict[str, set[str]]:
    """task → the product files outside its folder that name it."""
    tasks = {package.rsplit(".", 1)[1] for package in SHIPPED_TASKS}
    found: dict[str, set[str]] = {task: set() for task in tasks}
    for root in PRODUCT:
        for path in sorted((REPO / root).rglob("*")):
            if path.suffix == ".py":
                named = python_names(path, tasks)
            elif path.suffix in PAGES:
                named = page_names(path, tasks)
            else:
                continue
            for task in named:
                found[task].add(path.relative_to(REPO).as_posix())
    return found


def test_every_shipped_task_is_listed() -> None:
    assert sorted(ALLOWED) == sorted(package.rsplit(".", 1)[1] for package in SHIPPED_TASKS)


def test_only_the_listed_files_outside_a_task_folder_name_the_task() -> None:
    found = naming_files()
    for task, allowed in ALLOWED.items():
        assert sorted(found[task]) == sorted(allowed), task


def test_the_scanner_reads_tokens_not_prose(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text('"""About qa."""\n# embedding\nTASK = "summarization"\nx.classification = f"qa"\n')
    assert python_names(source, {"qa", "embedding", "summarization", "classification"}) == {
        "summarization",
        "classification",
    }
    page = tmp_path / "page.js"
    page.write_text('// qa\nconst a = { embedding: 1 }; /* classification */ b("sub-qa");\n')
    assert page_names(page, {"qa", "embedding", "classification"}) == {"embedding"}
