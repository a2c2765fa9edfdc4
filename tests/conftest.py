from __future__ import annotations

import os
import random
import socket

import pytest

# Never let a test pick up an operator's environment by accident. The compose test's switches are the test
# run's own (no product setting reads them), and this runs before any test module reads them.
for k in list(os.environ):
    if k.startswith("NEXTGUARD_") and k not in ("NEXTGUARD_HOME", "NEXTGUARD_COMPOSE", "NEXTGUARD_COMPOSE_PIP_PORT",
                                                 "NEXTGUARD_COMPOSE_PREBUILD"):
        del os.environ[k]


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
