"""docs/composition.md is the page that tests/mpi/composition_table.py renders from the
expectations the MPI composition test checks: regenerate it when they change."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table():
    spec = importlib.util.spec_from_file_location(
        "composition_table", ROOT / "tests" / "mpi" / "composition_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_is_the_rendered_table():
    page = (ROOT / "docs" / "composition.md").read_text()
    assert page == _table().markdown(), (
        "docs/composition.md is out of date: python tests/mpi/composition_table.py "
        "> docs/composition.md")


def test_every_refusal_names_both_features():
    table = _table()
    for features, (_, message) in table.REFUSED.items():
        for feature in features:
            assert any(n.lower() in message.lower() for n in table.NAMES[feature]), (
                feature, message)
