"""The OTLP layer sits at the bottom: the collector and the pipeline import it, never the reverse."""

from __future__ import annotations

import pathlib
import re

import schemas.otlp


def test_the_otlp_layer_imports_neither_collectors_nor_pipelines() -> None:
    root = pathlib.Path(schemas.otlp.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(agentlake|collectors|pipelines|trainer)\b", text, re.M), path


def test_both_sides_read_otlp_through_it() -> None:
    """No second copy of the wire code: the collector and the decoder import the layer."""
    root = pathlib.Path(schemas.otlp.__file__).parents[2]
    assert "from schemas.otlp" in (root / "collectors" / "records.py").read_text()
    decoding = "".join(p.read_text() for p in (root / "pipelines" / "bronze" / "decoding").glob("*.py"))
    for module in ("lite", "values", "packed"):
        assert re.search(rf"from schemas\.otlp(\.{module} import| import .*\b{module}\b)", decoding), module
