"""Several embedding models in one server: each answers `/v1/embeddings` by its served name and by its
source model's names, and `/metrics` says what holding each one costs (``retention_model_memory_bytes``).

    python -m experiments.served_models --models-dir /path/to/models \
        --out results/experiments/served-models/served_models.json

The app runs in this process over ASGI (``service.inprocess``: the public HTTP behaviour, no socket).
Each model embeds the same text at ρ = 1 and 0.3, by name and by every alias, and the vectors by alias
must equal the vectors by name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from retention_core.machine import describe

TEXT = "Which encoder keeps the tokens that matter and drops the rest?"
RHOS = (1.0, 0.3)
READY_TIMEOUT_S = 900.0


def model_memory(metrics_text: str) -> dict[str, float]:
    """``retention_model_memory_bytes`` per model from a /metrics page."""
    found = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "retention_model_memory_bytes":
            found.update({sample.labels["model"]: sample.value for sample in family.samples})
    return found


async def probe(models_dir: Path) -> dict[str, Any]:
    from service.api.app import create_app
    from service.inprocess import started
    from service.settings import Settings

    app = create_app(Settings(models_dir=models_dir))
    async with started(app, READY_TIMEOUT_S) as local:
        listing = (await local.request("GET", "/models")).json()
        aliases: dict[str, str] = listing["aliases"]
        rows = []
        for model in listing["models"]:
            name = model["name"]
            if model["task"] != "embedding":
                continue
            for rho in RHOS:
                body = {"input": TEXT, "model": name, "rho": rho}
                by_name = (await local.request("POST", "/v1/embeddings", json=body)).json()
                vector = by_name["data"][0]["embedding"]
                names = [alias for alias, target in aliases.items() if target == name]
                same = []
                for alias in names:
                    answer = await local.request("POST", "/v1/embeddings", json={**body, "model": alias})
                    same.append(answer.status_code == 200 and answer.json()["data"][0]["embedding"] == vector)
                rows.append(
                    {
                        "model": name,
                        "rho": rho,
                        "dimensions": len(vector),
                        "aliases": names,
                        "aliases_answer_the_same": all(same),
                        "token_work": by_name["usage"].get("token_work_fraction"),
                    }
                )
        memory = model_memory((await local.request("GET", "/metrics")).text)
    return {"text": TEXT, "embeddings": rows, "model_memory_bytes": memory, "machine": describe()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.served_models", description=__doc__)
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    payload = asyncio.run(probe(args.models_dir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"model_memory_bytes": payload["model_memory_bytes"]}, indent=2))


if __name__ == "__main__":
    main()
