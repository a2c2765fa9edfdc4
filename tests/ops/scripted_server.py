"""Run the real app (ops installed) on uvicorn with the scripted engine: ``python scripted_server.py PORT``.

Used by the SIGTERM drain test, which needs a real process to signal. Not a test module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _doubles() -> object:
    # Load tests/doubles.py by path: another installed distribution ships a top-level ``tests`` package.
    spec = importlib.util.spec_from_file_location("nextguard_test_doubles", ROOT / "tests" / "doubles.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import logging

    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from gateway.config import Settings
    from gateway.main import create_app
    from gateway.ops.config import OpsSettings
    from gateway.ops.lifecycle import install_ops

    port, home, redis_url = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    doubles = _doubles()
    engine = doubles.ScriptedEngine(pieces=[f"p{i} " for i in range(40)], delay=0.05)  # type: ignore[attr-defined]
    settings = Settings(home=home, redis={"url": redis_url, "embedded": False}, guard={"enabled": False},
                        server={"drain_timeout_s": 20})
    app = create_app(settings, engine=engine)
    if getattr(app.state, "ops", None) is None:
        install_ops(app, settings, ops=OpsSettings())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="info", timeout_graceful_shutdown=20)


if __name__ == "__main__":
    main()
