"""A worker process for the kill test: ``python tests/offline_suites/worker_proc.py PREFIX RESULTS_DIR``.

Run by path (a site-packages ``tests`` package shadows our namespace package outside pytest), and
the qt-* suites are loaded from the sibling file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    spec = importlib.util.spec_from_file_location("qt_suites", Path(__file__).with_name("queue_suites.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["qt_suites"] = mod          # dataclasses look their module up while building
    spec.loader.exec_module(mod)

    from offline_suites.config import SuiteSettings
    from offline_suites.worker import build_worker

    settings = SuiteSettings(key_prefix=sys.argv[1], results_dir=Path(sys.argv[2]), job_timeout_s=5, max_tries=3,
                             poll_interval_s=0.1)
    build_worker(settings, "redis://127.0.0.1:6379/0", poll_delay=0.1).run()
