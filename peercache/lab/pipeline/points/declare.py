"""What every point kind is made of: typed knobs, points, and the :class:`Kind` base each kind module extends.

A kind declares every knob a scenario part may set, once and typed (in the manner of ReFrame's
``variable`` / ``parameter``):

- a :func:`variable` is one value per part (``tool: ib_read_bw``);
- a :func:`parameter` is a sweep dimension: the part gives a list and the grid is the product of every
  parameter's list, in declaration order.

A kind also says how its points are named (the names are the keys of the raw folders, the tidy data
and the charts, so they never change for a given grid), which tool it wraps (the ``tool`` column of its
rows), which metrics it yields, in which units, and how a point of it runs (:meth:`Kind.run`). Nothing
here starts a process; the registry is :mod:`peercache.lab.pipeline.kinds`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: kind name -> kind class, filled as each Kind subclass is defined (the per-kind modules of
#: :mod:`peercache.lab.pipeline.points`, imported by :mod:`peercache.lab.pipeline.kinds`).
KINDS: dict[str, type["Kind"]] = {}

#: A knob without a default must be given by the scenario part.
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()

# JSON-schema fragments for knob values.
POSITIVE_INT = {"type": "integer", "minimum": 1}
BOOL = {"type": "boolean"}
SECONDS = {"type": "number", "exclusiveMinimum": 0}
NULLABLE_INT = {"type": ["integer", "null"], "minimum": 1}
NULLABLE_SECONDS = {"type": ["number", "null"], "minimum": 0}
NULLABLE_MICROSECONDS = {"type": ["integer", "null"], "minimum": 0, "maximum": 1_000_000}


def one_of(*values: Any) -> dict[str, Any]:
    """Schema of a knob that takes one of ``values``."""
    return {"enum": list(values)}


@dataclass(frozen=True)
class Knob:
    """One declared knob of a kind: its value schema, default, meaning and how it shows in a point name."""

    schema: dict[str, Any]         #: JSON schema of one value
    default: Any = REQUIRED        #: REQUIRED: the part must give it
    doc: str = ""                  #: what it means (and the tool flag it becomes)
    sweep: bool = False            #: a parameter: the part gives a list, one point per value
    tag: str | None = None         #: name suffix when a variable differs from its default ("ws{}"; "{}" = value)
    name: str = ""                 #: set from the class attribute name

    def value_schema(self) -> dict[str, Any]:
        """Schema of the knob's entry in a scenario part."""
        if self.sweep:
            return {"type": "array", "minItems": 1, "items": self.schema, "description": self.doc}
        return dict(self.schema, description=self.doc)


def variable(schema: dict[str, Any], default: Any = REQUIRED, doc: str = "", tag: str | None = None) -> Knob:
    """A knob with one value per scenario part."""
    return Knob(schema, default, doc, sweep=False, tag=tag)


def parameter(schema: dict[str, Any], default: Any = REQUIRED, doc: str = "") -> Knob:
    """A sweep dimension: the scenario part lists its values, one point per value (product with the others)."""
    return Knob(schema, default, doc, sweep=True)


def sizes(n: int) -> str:
    """Bytes as point names spell them: 131072 -> '128K', 1048576 -> '1M', 100 -> '100'."""
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


@dataclass
class Point:
    """One measurement to run: its kind, its parameters, and why it is skipped (None: it runs)."""

    scenario: str
    name: str
    kind: str                     #: a name in KINDS (see :func:`kind_of`)
    params: dict[str, Any] = field(default_factory=dict)
    skip_reason: str | None = None
    loopback: bool = False        #: run both sides on this host over 127.0.0.1, not on the testbed's hosts
    part: str = ""                #: the scenario part it came from (its name in the scenario file)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"point {self.scenario}/{self.name}: kind {self.kind!r} is not one of "
                             f"{sorted(KINDS)} (peercache.lab.pipeline.kinds)")

    @property
    def spec(self) -> type["Kind"]:
        """The point's kind class."""
        return KINDS[self.kind]

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


class Kind:
    """Base of every point kind; a subclass declares knobs as class attributes (:func:`variable`, :func:`parameter`)."""

    name: ClassVar[str]                   #: the value of ``kind:`` in a scenario part
    metrics: ClassVar[dict[str, str]]     #: metric -> unit of the rows it yields (perf counters aside)
    primary: ClassVar[str]                #: the headline metric (a failed or skipped point's row)
    is_get: ClassVar[bool] = False        #: measures PeerCache GETs (compared with a raw limit), not a raw tool
    tool_column: ClassVar[str | None] = None   #: the ``tool`` column of its rows, unless row_tool derives it
    knobs: ClassVar[dict[str, Knob]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        knobs: dict[str, Knob] = {}
        for base in reversed(cls.__mro__[1:]):
            knobs.update(getattr(base, "knobs", {}))
        for attr, v in list(vars(cls).items()):
            if isinstance(v, Knob):
                knobs[attr] = Knob(v.schema, v.default, v.doc, v.sweep, v.tag, attr)
        cls.knobs = knobs
        if getattr(cls, "name", None):
            if cls.primary not in cls.metrics:
                raise TypeError(f"kind {cls.name}: primary metric {cls.primary!r} is not in its metrics")
            # Kind.expand names points with point_name; a kind with its own expand names them there.
            needs = (("row_tool", "run") if cls.expand.__func__ is not Kind.expand.__func__
                     else ("point_name", "row_tool", "run"))
            missing = [m for m in needs if getattr(cls, m).__func__ is getattr(Kind, m).__func__
                       and not (m == "row_tool" and cls.tool_column)]
            if missing:
                raise TypeError(f"kind {cls.name}: define {', '.join(missing)} (every registered kind names its "
                                "points and the tool of its rows (row_tool or tool_column), and runs them)")
            KINDS[cls.name] = cls

    # -- what a scenario part may say ---------------------------------------------------
    @classmethod
    def part_schema(cls) -> dict[str, Any]:
        """JSON schema of one scenario part of this kind."""
        return {"type": "object", "additionalProperties": False,
                "required": ["kind", *[k for k, v in cls.knobs.items() if v.default is REQUIRED]],
                "properties": {"kind": {"const": cls.name}, "place": one_of("testbed", "loopback"),
                               **{k: v.value_schema() for k, v in cls.knobs.items()}}}

    @classmethod
    def values(cls, part: dict[str, Any]) -> dict[str, Any]:
        """The part's knob values with defaults filled in (the part is already schema-valid)."""
        return {k: part.get(k, v.default) for k, v in cls.knobs.items()}

    # -- the grid ------------------------------------------------------------------
    @classmethod
    def expand(cls, scenario: str, part: dict[str, Any], devices: list[str]) -> list[Point]:
        """One point per combination of the part's parameters (declaration order), named and parametrised."""
        vals = cls.values(part)
        sweeps = [k for k, v in cls.knobs.items() if v.sweep]
        pts = []
        for combo in itertools.product(*(vals[k] for k in sweeps)):
            one = dict(vals, **dict(zip(sweeps, combo)))
            pts.append(Point(scenario, cls.point_name(one) + cls.tags(one), cls.name, cls.params(one, devices),
                             loopback=part.get("place") == "loopback"))
        return pts

    @classmethod
    def tags(cls, one: dict[str, Any]) -> str:
        """Name suffixes of the variables that differ from their defaults (none for the published grids)."""
        out = ""
        for k, v in cls.knobs.items():
            if v.tag is None or v.sweep or one[k] == v.default:
                continue
            out += "_" + (v.tag if isinstance(one[k], bool) else v.tag.format(one[k]))
        return out

    @classmethod
    def point_name(cls, one: dict[str, Any]) -> str:
        """The point's name from one combination of knob values (defined by every kind that uses Kind.expand)."""
        raise NotImplementedError(f"kind {cls.__name__} defines no point_name")

    @classmethod
    def params(cls, one: dict[str, Any], devices: list[str]) -> dict[str, Any]:
        """The point's parameters, as the runner reads them."""
        return dict(one)

    @classmethod
    def changed(cls, one: dict[str, Any], *names: str) -> dict[str, Any]:
        """The knobs among ``names`` whose value differs from their default (a point's parameters name only those)."""
        return {k: one[k] for k in names if one[k] != cls.knobs[k].default}

    # -- what its rows say ---------------------------------------------------------
    @classmethod
    def row_tool(cls, params: dict[str, Any]) -> str:
        """The ``tool`` column of the point's rows: :attr:`tool_column`, unless the kind derives it from ``params``
        (every registered kind says one or the other)."""
        if cls.tool_column:
            return cls.tool_column
        raise NotImplementedError(f"kind {cls.__name__} defines no row_tool")

    @classmethod
    def unit(cls, metric: str | None = None) -> str:
        """Unit of ``metric`` (default: the primary metric)."""
        return cls.metrics[metric or cls.primary]

    @classmethod
    def port_devices(cls, params: dict[str, Any], testbed_devices: list[str]) -> list[str]:
        """RDMA devices whose port counters bound this point's figures (none for non-RDMA kinds)."""
        return []

    @classmethod
    def cell(cls, params: dict[str, Any]) -> tuple[int, int] | None:
        """The cell of a point whose figures are set beside other kinds' (the engines table's): its page size
        and its reader threads in all (processes x threads); None for a point with no page (a raw tool's)."""
        if params.get("page_size") is None or params.get("threads") is None:
            return None
        return int(params["page_size"]), int(params.get("processes") or 1) * int(params["threads"])

    @classmethod
    def hosts_needed(cls, params: dict[str, Any]) -> int:
        """Hosts a point of this kind spans: 2 (a producer and a consumer) unless the kind says more."""
        return 2

    @classmethod
    def windows(cls, params: dict[str, Any]) -> int:
        """How many measured windows (warm-up + duration each) one point runs one after another: 1, unless
        the kind sweeps inside its tool (the harness's waits scale with it)."""
        return 1

    @classmethod
    def figure_window(cls, params: dict[str, Any], row: Any, bps: float, duration: float) -> float:
        """The seconds a bandwidth figure of this kind covers (what its port counters are compared over):
        the point's measured duration, unless the kind says otherwise."""
        return duration

    @classmethod
    def counter_direction(cls, row: Any) -> str:
        """Which port counter of the consumer's devices a bandwidth row is checked against: ``rcv`` (it
        receives what a READ or a GET moves) unless the kind says ``xmit``."""
        return "rcv"

    # -- how it runs -----------------------------------------------------------------
    @classmethod
    def run(cls, pr: "PointRun", th: "TestbedHosts") -> None:
        """Run one point of this kind with the shared harness ``pr`` on the hosts ``th``: launch its
        processes, check what they said (sanity) and add its rows to ``pr.rows`` (every registered kind
        defines it)."""
        raise NotImplementedError(f"kind {cls.__name__} defines no run")


#: Wrap the client in perf stat (bool): a knob of the raw kinds whose client it can count.
PERF_STAT = variable(BOOL, False, "run the client under perf stat")


class Timed(Kind):
    """Knobs every timed kind shares: the testbed gives duration and warm-up unless a part overrides them."""

    duration = variable(NULLABLE_SECONDS, None, "measured seconds [the testbed's duration]", tag="d{}")
    warmup = variable(NULLABLE_SECONDS, None, "unmeasured seconds before [the testbed's warmup]", tag="w{}")


def timing(one: dict[str, Any]) -> dict[str, Any]:
    """The duration and warm-up a part set (none: the testbed's), as point parameters."""
    return {k: one[k] for k in ("duration", "warmup") if one.get(k) is not None}
