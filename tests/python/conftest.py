# pytest set-up: a private kernel cache per session, so tests never touch the user's.
import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache():
    if "FLEXJIT_CACHE_DIR" in os.environ:
        yield
        return
    with tempfile.TemporaryDirectory() as d:
        os.environ["FLEXJIT_CACHE_DIR"] = d
        yield
