"""A batch source declares the views its batches hold, and the Trainer refuses, at construction, a method whose
loss part reads a view the source does not yield: naming the part, the view and what the source has. A misspelled
or missing view must not train at loss 0."""

from __future__ import annotations

import pytest

from porch_jax.train import mesh as mesh_lib
from porch_jax.train.config import MethodConfig, TrainConfig
from porch_jax.train.methods import make_method
from porch_jax.train.packing import SeqRow, Span
from porch_jax.train.sources import CombinedViews, PackedSource
from porch_jax.train.trainer import Trainer


def _packed(view: str) -> PackedSource:
    rows = [SeqRow((1, 2, 3, 4), (Span(1, 3),), ("e", i)) for i in range(2)]
    return PackedSource(rows, 2, (8,), 0, mesh_lib.make_mesh((1, 1, 1)), view)


@pytest.mark.parametrize(
    ("method", "source", "part", "view"),
    [
        ("opod", lambda: _packed("policy"), "rwr", "rwr"),  # OPOD's RWR part reads "rwr"
        ("rwr", lambda: _packed("rwr"), "rwr", "policy"),  # RWR alone reads "policy"
        ("opd", lambda: CombinedViews(_packed("rwr")), "opd", "student"),
    ],
)
def test_a_source_without_a_view_the_method_reads_is_refused_naming_it(method, source, part, view):
    src = source()
    cfg = TrainConfig(steps=1, method=MethodConfig(name=method))
    with pytest.raises(ValueError) as info:
        Trainer(cfg, None, make_method(cfg.method), src, None)
    message = str(info.value)
    assert f"method {method!r}" in message and f"part {part!r} reads view {view!r}" in message
    assert f"yields {src.views[0]!r}" in message


def test_combined_sources_yield_each_view_once():
    assert CombinedViews(_packed("rwr"), _packed("policy")).views == ("rwr", "policy")
    with pytest.raises(ValueError, match="yield a view twice"):
        CombinedViews(_packed("rwr"), _packed("rwr"))
