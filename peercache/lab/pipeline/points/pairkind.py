"""A kind whose point is one pair, server on the producer and client on the consumer (:class:`PairKind`): what
it declares is its own (:meth:`PairKind.launch`: its command lines, readiness and row context; :meth:`PairKind.read`:
its parser call; :meth:`PairKind.rows`: its rows); the harness it is given runs the rest once for every such kind
(``PointRun.run_pair``: start the pair, record it, read, fail with the reason, note a pair that failed after a
complete output, add the rows and the CPU evidence).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.declare import Kind
from peercache.lab.tidy import Row

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


@dataclass
class Launch:
    """What a pair kind starts for one point, and the columns its rows and its failed row carry."""

    server: list[str]                      #: argv on the producer
    client: list[str]                      #: argv on the consumer
    ready: Readiness                       #: when the server is ready for the client
    ctx: dict[str, Any]                    #: the context of its rows (``pr.ctx(...)``)
    failed: dict[str, Any]                 #: the columns of its failed row (beside the point's context)
    devices: list[str] = field(default_factory=list)   #: the NICs both sides are bound near
    server_exits: bool = True              #: False: the server runs until the pair runner ends it
    out: str | None = None                 #: the file the client writes on the consumer, if any
    own: dict[str, Any] = field(default_factory=dict)   #: what the kind's read needs of its launch
    cleanup: Callable[[], None] | None = None   #: runs after the read, whatever it found
    #: argv on the consumer run to its end against the ready server before ``client``, its figure discarded:
    #: the warm-up of a tool that has none of its own
    warmup: list[str] | None = None


class PairKind(Kind):
    """Base of a kind whose point is one pair; ``run`` is the harness's (``PointRun.run_pair``)."""

    #: what the client's finished output is called ("sockperf report"): the note of a pair that reported a
    #: failure after it says so
    output: ClassVar[str]
    #: the errors of :meth:`read` that mean the output holds no figure: the point fails with the reason
    read_errors: ClassVar[tuple[type[Exception], ...]] = (ParseError, ToolError)

    @classmethod
    def launch(cls, pr: "PointRun", th: "TestbedHosts") -> Launch | None:
        """The pair to start for this point; None when the kind recorded it skipped, with why."""
        raise NotImplementedError(f"kind {cls.__name__} defines no launch")

    @classmethod
    def read(cls, pr: "PointRun", th: "TestbedHosts", launch: Launch, res: Any) -> Any:
        """The client's result from the pair's outcome ``res`` (its parser call); raises one of
        :attr:`read_errors` when there is none."""
        raise NotImplementedError(f"kind {cls.__name__} defines no read")

    @classmethod
    def rows(cls, pr: "PointRun", launch: Launch, result: Any) -> Iterable[Row]:
        """The point's rows from the client's result."""
        raise NotImplementedError(f"kind {cls.__name__} defines no rows")

    @classmethod
    def failed_reason(cls, err: str | None, e: Exception) -> str:
        """The failed row's reason when :meth:`read` found no result: the pair's failure, then the read's."""
        return f"{err}: {e}" if err else str(e)

    @classmethod
    def check(cls, result: Any, rows: list[Row]) -> str | None:
        """Why a result that was read still holds no figure its rows do not already fail for (None: it holds one)."""
        return None

    @classmethod
    def complete(cls, result: Any) -> bool:
        """Whether the client finished (a pair failure after that is noted, not failed)."""
        return True

    @classmethod
    def cpu_evidence(cls, pr: "PointRun", res: Any, result: Any, rows: list[Row]) -> None:
        """Both sides' CPU use in the rows: over the middle of the client's run unless the result names a window."""
        pr.attach_pair_cpu(*pr.pair_window(res))

    @classmethod
    def run(cls, pr: "PointRun", th: "TestbedHosts") -> None:
        pr.run_pair(cls, th)
