"""The one path from a pair kind's launch to its rows (:func:`run_pair`): start the pair, record it, read the
client's result, and then fail with the reason, note a failure after a complete output, add the rows and the
CPU evidence, once for every kind (a kind holds only what is its own:
:class:`peercache.lab.pipeline.points.pairkind.PairKind`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peercache.lab.pipeline.points.pairkind import PairKind
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


def run_pair(pr: PointRun, kind: type[PairKind], th: TestbedHosts) -> None:
    """Run one point of the pair kind ``kind`` in the harness ``pr`` on the hosts ``th``; what failed is a
    failed row (the kind's headline metric) with the reason, never raised."""
    launch = kind.launch(pr, th)
    if launch is None:              # recorded skipped by the kind, with why
        return
    res, err = pr.pair(launch.server, launch.client, launch.ready, th, launch.devices,
                       server_exits=launch.server_exits, warmup=launch.warmup)
    pr.record(res)
    try:
        result = kind.read(pr, th, launch, res)
    except kind.read_errors as e:
        pr.fail(kind.primary, kind.unit(), kind.failed_reason(err, e), **launch.failed)
        return
    finally:
        if launch.cleanup is not None:
            launch.cleanup()
    rows = list(kind.rows(pr, launch, result))
    pr.rows += rows
    why = kind.check(result, rows)
    if why:
        pr.fail(kind.primary, kind.unit(), why, **launch.failed)
    elif err and kind.complete(result):
        pr.notes.append(f"pair reported a failure after a complete {kind.output}: {err}")
    kind.cpu_evidence(pr, res, result, rows)
