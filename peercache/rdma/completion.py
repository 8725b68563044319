"""Work-completion statuses: rdma-core's ``ibv_wc_status`` codes, their names and per-op Status.

The verbs backend accounts completions in C (``poll_run`` in native/verbs.c, with
``pv_wc_status`` for the per-op Status); tests/oracles/rdma_completion.py is the Python oracle
of that accounting, and tests/engine/transport/test_rdma_verbs.py compares the native status map with
WC_TO_STATUS.
"""
from __future__ import annotations

import enum

from ..transport.base import Status


class WC(enum.IntEnum):
    """``enum ibv_wc_status`` of rdma-core's verbs.h.

    The one table of these codes and names: the lab's perftest failure reader takes them from here (a
    named seam of the import contracts), so a member renamed here must be renamed in its texts too.
    """

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


#: Work-completion status -> per-op Status. Anything not listed is CONNECTION.
WC_TO_STATUS: dict[int, Status] = {
    WC.SUCCESS: Status.OK,
    # The remote key was wrong or the region is gone (range is checked before posting).
    WC.REM_ACCESS_ERR: Status.BAD_REGION,
    WC.REM_INV_RD_REQ_ERR: Status.BAD_REGION,
    WC.REM_INV_REQ_ERR: Status.REFUSED,
    WC.REM_OP_ERR: Status.REFUSED,
    WC.REM_ABORT_ERR: Status.REFUSED,
    # The local side: a destination not covered by its memory registration.
    WC.LOC_LEN_ERR: Status.LOCAL_RANGE,
    WC.LOC_PROT_ERR: Status.LOCAL_RANGE,
    WC.LOC_ACCESS_ERR: Status.LOCAL_RANGE,
    # The peer did not answer or the QP was flushed: the channel is gone.
    WC.RETRY_EXC_ERR: Status.CONNECTION,
    WC.RNR_RETRY_EXC_ERR: Status.CONNECTION,
    WC.RESP_TIMEOUT_ERR: Status.CONNECTION,
    WC.WR_FLUSH_ERR: Status.CONNECTION,
}


def wc_status(code: int) -> Status:
    """Per-op Status for an ``ibv_wc_status`` value."""
    return WC_TO_STATUS.get(int(code), Status.CONNECTION)


def wc_name(code: int) -> str:
    """``IBV_WC_...`` name of a status value (for error text)."""
    try:
        return f"IBV_WC_{WC(code).name}"
    except ValueError:
        return f"ibv_wc_status {code}"

