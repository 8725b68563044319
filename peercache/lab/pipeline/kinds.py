"""The registry of point kinds: one module per kind (:mod:`peercache.lab.pipeline.points`), each a small
declarative class with its run, sanity check and metric extraction beside it.

A scenario part in ``experiments/scenarios.yaml`` names its kind
(``{kind: perftest, tool: ib_read_bw, qps: [16], size: [131072]}``); the
kind declares every knob the part may set, once and typed (in the manner of
ReFrame's ``variable`` / ``parameter``):

- a :func:`variable` is one value per part (``tool: ib_read_bw``);
- a :func:`parameter` is a sweep dimension: the part gives a list and the
  grid is the product of every parameter's list, in declaration order.

A kind also says how its points are named (the names are the keys of the raw
folders, the tidy data and the charts, so they never change for a given
grid), how a point of it runs (:meth:`Kind.run`, given the shared
``PointRun`` harness), which tool it wraps (the ``tool`` column of its rows)
and which metrics it yields, in which units. The JSON schema of the scenario
file is generated from these declarations (:func:`part_schema`), so a typo
names the file and the field. The declaration types live in
:mod:`peercache.lab.pipeline.points.declare` and are re-exported here;
importing this module registers every kind. Nothing here starts a process.
"""
from __future__ import annotations

from typing import Any

from peercache.lab.pipeline import points  # noqa: F401  (imports every kind module: fills KINDS)
from peercache.lab.pipeline.points.declare import (BOOL, KINDS, NULLABLE_INT, NULLABLE_MICROSECONDS,  # noqa: F401
                                                   NULLABLE_SECONDS, POSITIVE_INT, REQUIRED, SECONDS, Kind, Knob,
                                                   Point, Timed, one_of, parameter, sizes, timing, variable)


def kind_of(name: str) -> type[Kind]:
    """The kind class called ``name``."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"no point kind {name!r}; known: {sorted(KINDS)}") from None


def part_schema() -> dict[str, Any]:
    """JSON schema of any scenario part: ``kind`` picks the kind, whose declared knobs are then checked."""
    return {"type": "object", "required": ["kind"],
            "properties": {"kind": {"enum": sorted(KINDS)}},
            "allOf": [{"if": {"properties": {"kind": {"const": n}}, "required": ["kind"]},
                       "then": {"$ref": f"#/$defs/kind_{n}"}} for n in sorted(KINDS)]}


def kind_defs() -> dict[str, Any]:
    """``$defs`` of every kind's part schema."""
    return {f"kind_{n}": k.part_schema() for n, k in sorted(KINDS.items())}
