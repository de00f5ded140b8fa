"""``python -m service --models-dir models --host 127.0.0.1 --port 8000``: run the API with uvicorn.

Every option can also come from the environment (``RETENTION_*``, see ``service.settings``); command
line flags win. SIGHUP reloads the models directory (``--reload-interval-s N``: also every N seconds, when
it changed); SIGTERM drains in-flight requests and exits.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, help="root holding one directory per model")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--intra-op-threads", type=int, help="onnxruntime intra-op threads per session")
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' (prefer RETENTION_API_KEY)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--reload-interval-s", type=float, help="rescan the models directory this often (0 = only on SIGHUP)"
    )
    args = parser.parse_args(argv)

    import uvicorn

    from service.api.app import create_app
    from service.settings import Settings

    overrides = {
        key: value
        for key, value in {
            "models_dir": args.models_dir,
            "host": args.host,
            "port": args.port,
            "intra_op_threads": args.intra_op_threads,
            "api_key": args.api_key,
            "log_level": args.log_level,
            "reload_interval_s": args.reload_interval_s,
        }.items()
        if value is not None
    }
    settings = Settings(**overrides)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s) or None,
    )


if __name__ == "__main__":
    main()
