"""Mixed-shape soak: RSS of one ``python -m service`` process under every mix of shapes it may see.

    python -m experiments.soak --models-dir <dir with an embedding model> --seconds 600 \
        --server-cpus 0 --client-cpus 1 --out results/experiments/soak/soak-mixed.json
    python -m experiments.soak --models-dir <tiny models> --seconds 5 --interval 1 --out /tmp/soak.json

Closed-loop clients (``--concurrency``, in this process, pinned to ``--client-cpus``) send ``/embed``
requests of 1 to ``--max-inputs`` texts, each from one word to ``--max-words`` words (past the model's
``max_length``: truncated), at a rho drawn from ``RHOS`` (``auto`` included) per request, so ORT sees
every batch size and padded length the batcher forms. RSS is sampled every ``--interval`` seconds;
growth counts from the first sample after ``--warm-seconds`` (the arena and caches filling up is not
growth). The idle latency (p50 of sequential one-word requests) is measured before and after the load.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import fmt, publish
from benchmarks.load import make_texts
from benchmarks.overload import Policy, RssSampler, idle_latency_ms, server

RHOS = ("0.1", "0.2", "0.3", "0.5", "0.7", "1", "auto")
IDLE_BODY = {"texts": ["hello"]}


def drive(
    url: str, seconds: float, concurrency: int, texts: list[str], max_inputs: int, seed: int
) -> dict[str, int]:
    """Closed-loop mixed-shape clients for ``seconds``; status counts."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        rng = random.Random(seed + index)
        with httpx.Client(timeout=60) as session:
            while time.monotonic() < stop:
                body = {"texts": rng.sample(texts, rng.randint(1, max_inputs))}
                try:
                    status = str(session.post(f"{url}/embed?rho={rng.choice(RHOS)}", json=body).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    texts = make_texts(args.texts, 1, args.max_words, args.seed)
    policy = Policy("soak", "mixed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".server-logs")  # the server's log, kept only when it failed
    log.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with server(args.models_dir, policy, {}, log, args.server_cpus) as (url, pid):
        idle_before = idle_latency_ms(url, "/embed", IDLE_BODY)
        with RssSampler(pid, interval=args.interval) as rss:
            begin = time.monotonic()
            counts = drive(url, args.seconds, args.concurrency, texts, args.max_inputs, args.seed)
            elapsed = time.monotonic() - begin
        time.sleep(args.settle)
        idle_after = idle_latency_ms(url, "/embed", IDLE_BODY)
        rss_idle_after = rss.mib()
    shutil.rmtree(log)
    samples = rss.samples
    warm = min(len(samples) - 1, int(args.warm_seconds / args.interval))
    base = samples[warm]
    return {
        "seconds": elapsed,
        "interval_s": args.interval,
        "warm_seconds": args.warm_seconds,
        "concurrency": args.concurrency,
        "max_inputs": args.max_inputs,
        "max_words": args.max_words,
        "rhos": list(RHOS),
        "statuses": counts,
        "requests_per_s": sum(counts.values()) / elapsed,
        "rss_mib": [round(s, 1) for s in samples],
        "rss_after_warm_mib": round(base, 1),
        "rss_peak_mib": round(max(samples), 1),
        "rss_end_mib": round(samples[-1], 1),
        "rss_idle_after_mib": round(rss_idle_after, 1),
        "growth_after_warm_percent": round(100 * (max(samples[warm:]) - base) / base, 2),
        "idle_before_p50_ms": idle_before,
        "idle_after_p50_ms": idle_after,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "server_cpus": args.server_cpus,
        "client_cpus": args.client_cpus,
    }


def markdown(report: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"# Mixed-shape soak ({report['seconds']:.0f} s, {report['concurrency']} closed-loop clients)",
            "",
            f"/embed requests of 1-{report['max_inputs']} texts of 1-{report['max_words']} words, rho drawn "
            f"from {', '.join(report['rhos'])}; {report['requests_per_s']:.1f} requests/s; "
            f"statuses {report['statuses']}.",
            "",
            "| RSS after warm-up MiB | peak MiB | end MiB | growth after warm-up | idle p50 before ms |"
            " idle p50 after ms | load average before / after |",
            "|---:|---:|---:|---:|---:|---:|---|",
            f"| {report['rss_after_warm_mib']:.0f} | {report['rss_peak_mib']:.0f} "
            f"| {report['rss_end_mib']:.0f} "
            f"| {report['growth_after_warm_percent']:+.1f}% | {fmt(report['idle_before_p50_ms'])} "
            f"| {fmt(report['idle_after_p50_ms'])} | {report['loadavg_before'][0]:.1f} / "
            f"{report['loadavg_after'][0]:.1f} |",
            "",
        ]
    )


def plot(report: dict[str, Any], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    samples = report["rss_mib"]
    times = [i * report["interval_s"] for i in range(len(samples))]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.plot(times, samples, marker="o", markersize=3)
    base = report["rss_after_warm_mib"]
    axis.axhline(base * 1.1, color="grey", linestyle="--", label="+10% over the RSS after warm-up")
    axis.axvline(report["warm_seconds"], color="grey", linestyle=":", label="warm-up ends")
    axis.set_xlabel("seconds")
    axis.set_ylabel("server RSS (MiB)")
    axis.set_ylim(0, max(samples) * 1.2)
    axis.set_title("Mixed-shape soak: 1-64 inputs, 1 word to 256 tokens, every rho")
    axis.grid(True, alpha=0.3)
    axis.legend(loc="lower right")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, required=True, help="holding the embedding model")
    parser.add_argument("--out", type=Path, required=True, help="JSON (+ .md beside it)")
    parser.add_argument("--plot", type=Path, help="the plot's path (default: --out with .png)")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--interval", type=float, default=10.0, help="RSS every this many seconds")
    parser.add_argument("--warm-seconds", type=float, default=60.0, help="growth counts after this")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between the load and idle probe")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-inputs", type=int, default=64)
    parser.add_argument("--max-words", type=int, default=200, help="past 256 tokens: truncated")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-cpus", type=int, nargs="+")
    parser.add_argument("--client-cpus", type=int, nargs="+")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    publish(report, markdown, args.out, "experiments.soak", argv, machine=True, show=False)
    image = plot(report, args.plot or args.out.with_suffix(".png"))
    print(markdown(report) + f"wrote {args.out}" + (f", {image}" if image else ""))
    return report


if __name__ == "__main__":
    main()
