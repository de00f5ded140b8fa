"""Time to first answer: a fresh clone, ``make serve``, until the first ``POST /embed`` answers (issue 20).

    python -m experiments.first_answer --dest /tmp/ttfa \
        --out results/experiments/first-answer/first_answer.json
    python -m experiments.first_answer --overlay Makefile scripts/serve.sh ...   # + uncommitted files

Clones ``--source`` (default: this checkout) into ``--dest`` (removed first; ``../shared/data`` must
exist beside it for the data), starts ``make serve`` there in its own process group and times each
phase by watching for what marks its end:

- install: the virtual environment and pip installs (``.venv/.installed`` appears);
- fit: the frozen embedding retrofit, the stand-in ``make serve`` answers with first, trains
  (``runs/minilm-embed-frozen-quick/weights.safetensors`` appears; the two-path model trains later, in the
  background);
- export: ONNX export, parity check and the manifest's quality curve (``models/minilm-embed/manifest.json``
  appears; the exporter swaps the directory in complete);
- service start: ``GET /livez`` answers;
- first answer: ``POST /embed`` answers 200 with a vector.

Then it presses Ctrl-C (SIGINT to the process group, as a terminal does) and records whether the
service and the background build both stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks._http import is_ok
from benchmarks.harness import describe, write_result

TARGET_S = 300.0  # issue 20: an answer from a fresh clone in ≤ 5 minutes on 2 cores
EMBED_MODEL = "minilm-embed"
FIRST_RUN = "minilm-embed-frozen-quick"  # the stand-in's run (models/recipes/minilm-embed-frozen.yaml)
POLL_S = 0.25


@dataclass(frozen=True)
class Phase:
    name: str
    done: Callable[[], bool]


def http_ok(url: str, body: dict[str, Any] | None = None) -> bool:
    """True when the URL answers 200 (a POST with ``body`` must also carry an embedding)."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = httpx.get(url, timeout=5) if body is None else httpx.post(url, json=body, timeout=5)
        return is_ok(response) and (body is None or bool(response.json().get("embedding")))
    return False


def phases(clone: Path, url: str) -> list[Phase]:
    return [
        Phase("install", (clone / ".venv" / ".installed").is_file),
        Phase("fit", (clone / "runs" / FIRST_RUN / "weights.safetensors").is_file),
        Phase("export", (clone / "models" / EMBED_MODEL / "manifest.json").is_file),
        Phase("service_start", lambda: http_ok(f"{url}/livez")),
        Phase("first_answer", lambda: http_ok(f"{url}/embed", {"text": "How long until the first answer?"})),
    ]


def clone(source: Path, dest: Path, overlay: list[str]) -> str:
    """A fresh clone of ``source`` at ``dest``, plus the ``overlay`` paths copied from its working tree
    (uncommitted changes under test). Returns the commit cloned."""
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run(["git", "clone", "--quiet", str(source), str(dest)], check=True)
    for relative in overlay:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / relative, target)
    head = subprocess.run(
        ["git", "-C", str(dest), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return head.stdout.strip()


def group_stats(pgid: int) -> list[list[str]]:
    """/proc/<pid>/stat fields (from the state on) of the live processes of group ``pgid``; a zombie
    (exited, not yet reaped by its parent) counts as ended."""
    stats = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            stats.append(fields)
    return stats


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) the process group has used so far: its live processes' own times plus
    those of the children they reaped (``cutime``/``cstime``), so pip runs that ended still count."""
    ticks = sum(int(value) for fields in group_stats(pgid) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def ctrl_c(process: subprocess.Popen[bytes], within_s: float) -> bool:
    """SIGINT to the whole process group (a terminal's Ctrl-C); True when every process of it ended."""
    pgid = process.pid  # start_new_session: the group id is make's pid
    os.killpg(pgid, signal.SIGINT)
    end = time.monotonic() + within_s
    while time.monotonic() < end and (process.poll() is None or group_stats(pgid)):
        time.sleep(POLL_S)
    stopped = process.poll() is not None and not group_stats(pgid)
    if not stopped:  # leave nothing running behind the measurement
        os.killpg(pgid, signal.SIGKILL)
    process.wait()
    return stopped


def measure(clone_dir: Path, port: int, timeout_s: float, log_path: Path) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    pending = phases(clone_dir, url)
    reached: dict[str, float] = {}
    cpu_at: dict[str, float] = {}
    load_at: dict[str, float] = {}
    env = {**os.environ, "PORT": str(port)}
    env.pop("VIRTUAL_ENV", None)
    with log_path.open("wb") as log:
        start = time.monotonic()
        process = subprocess.Popen(
            ["make", "serve", f"PORT={port}"],
            cwd=clone_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: Ctrl-C below reaches all of it
            preexec_fn=default_sigint,
        )
        while pending and time.monotonic() - start < timeout_s and process.poll() is None:
            # A later phase may end before an earlier one is seen (same poll): record them in order.
            while pending and pending[0].done():
                name = pending.pop(0).name
                reached[name] = round(time.monotonic() - start, 1)
                cpu_at[name] = group_cpu_s(process.pid)
                load_at[name] = round(os.getloadavg()[0], 2)
            time.sleep(POLL_S)
        exited = process.poll()
        stopped = ctrl_c(process, within_s=60.0) if exited is None else False
    return {
        "reached_at_s": reached,
        "phases_s": differences(reached),
        "phases_cpu_s": differences(cpu_at),
        "load_average_1min_at": load_at,
        "first_answer_s": reached.get("first_answer"),
        "missing_phases": [phase.name for phase in pending],
        "make_exited_early": exited,
        "ctrl_c_stopped_everything": stopped,
    }


def differences(cumulative: dict[str, float]) -> dict[str, float]:
    """Per-phase amounts from cumulative marks (in phase order)."""
    marks = list(cumulative.values())
    return {
        name: round(at - (marks[i - 1] if i else 0.0), 1) for i, (name, at) in enumerate(cumulative.items())
    }


def default_sigint() -> None:
    """In the child: Ctrl-C acts as in a terminal even when this driver runs in the background (a
    background job of a non-interactive shell ignores SIGINT, and its children would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def markdown(payload: dict[str, Any]) -> str:
    first = payload["first_answer_s"]
    met = first is not None and first <= TARGET_S
    verdict = "not reached" if first is None else f"{first:.0f} s ({'met' if met else 'missed'})"
    lines = [
        f"Time to first answer from a fresh clone (`make serve` → first `POST /embed` 200): **{verdict}**, "
        f"target ≤ {TARGET_S:.0f} s.",
        "",
        "| phase | wall seconds | reached at (s) | CPU seconds (all processes) | load average at its end |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {seconds} | {payload['reached_at_s'][name]} | {payload['phases_cpu_s'].get(name)}"
            f" | {payload['load_average_1min_at'].get(name)} |"
            for name, seconds in payload["phases_s"].items()
        ),
        "",
        f"Machine: {payload['machine'].get('cpu', '?')}, {payload['machine'].get('cores', '?')} cores; "
        f"load average before / after: {payload['load_average_before']} / {payload['load_average_after']}.",
    ]
    for key in ("note", "analysis"):
        if payload.get(key):
            lines += ["", payload[key]]
    lines += ["", f"Command: `{payload['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.first_answer", description=__doc__)
    parser.add_argument("--source", type=Path, default=Path.cwd(), help="the repository to clone")
    parser.add_argument("--dest", type=Path, default=Path("/tmp/ttfa"), help="../shared/data beside it")
    parser.add_argument("--overlay", nargs="*", default=[], help="files copied over the clone (uncommitted)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--note", default="", help="what the numbers should be read with (a shared machine)")
    parser.add_argument(
        "--out", type=Path, default=Path("results/experiments/first-answer/first_answer.json")
    )
    args = parser.parse_args(argv)

    source = args.source.resolve()
    commit = clone(source, args.dest, args.overlay)
    log_path = args.dest.with_name(args.dest.name + ".log")
    load_before = [round(x, 2) for x in os.getloadavg()]
    result = measure(args.dest, args.port, args.timeout_s, log_path)
    payload: dict[str, Any] = {
        "what": "time to first answer from a fresh clone: `make serve` until the first POST /embed 200",
        "target_s": TARGET_S,
        **result,
        "cloned_commit": commit,
        "overlaid_from_working_tree": args.overlay,
        "log": str(log_path),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "pip_config": subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
        ).stdout.splitlines(),
        "machine": describe(),
        "note": args.note,
        "command": "python -m experiments.first_answer " + shlex.join(argv),
    }
    table = markdown(payload)
    write_result(args.out, payload, table)
    print(table)


if __name__ == "__main__":
    main()
