"""perftest (``ib_read_bw`` / ``ib_write_bw`` / ``ib_send_bw``): command builder and strict parsers.

One module per job, their names re-exported here:

- :mod:`.command`: :class:`PerftestParams`, the server's and client's argv, and where a ``-D`` run's
  sample lies in its loop (:func:`sample_window`);
- :mod:`.results`: the parsed records (:class:`PerftestResult`, its rows; the latency ones);
- :mod:`.text`: the text report (:func:`parse_output`, :func:`parse_latency_output`, :func:`parse_header`);
- :mod:`.jsonout`: the ``--out_json`` file (:func:`parse_json`, :func:`parse_latency_json`,
  :func:`cross_check`);
- :mod:`.failures`: what a failed run says (:func:`classify_failure`, :func:`completion_errors`; the
  work-completion statuses are the engine's ``peercache.rdma.completion.WC``);
- :mod:`.rows`: tidy rows of a result (:func:`to_rows`).

Units. perftest prints bandwidth in one of three labels. ``MB/sec`` (older
releases, Debian 12's perftest 4.5+0.17 "Version: 6.06" among them) and
``MiB/sec`` (newer releases) are the same unit: perftest divides by 0x100000
for both, the label was corrected later. ``Gb/sec``
(``--report_gbits``) divides by 125000000, i.e. 10^9 bit/s. Every value is
kept as printed (``raw_*`` plus the label) and normalised to bytes/s and
Gbit/s.

Peak. In duration mode (``-D``), with ``-N``, and on the receiving (server)
side of ``ib_send_bw`` perftest does not measure the peak and prints ``0.00``
(``0.000000`` with ``--report_gbits``); that is recorded as *not measured*
(``None``), never as a zero bandwidth.

Sides. The server of ``ib_write_bw -a`` / ``ib_read_bw -a`` prints one row,
the last size only; the client prints one row per size. With ``--report-both``
the server's "Local" and "Remote" tables are the client's swapped.

The ``--out_json`` file exists in two dialects: perftest up to 6.x writes
unquoted keys and trailing commas (not JSON; linux-rdma/perftest#216; the real
6.06 captures in tests/fixtures/lab/perftest/softroce are of this kind), later
releases write standard JSON. :func:`parse_json` reads both. The file does not
say its unit, so the caller passes it (or :func:`cross_check` takes it from
the text output of the same run).

Latency tests (``ib_read_lat`` / ``ib_write_lat`` / ``ib_send_lat``) are read by
:func:`parse_latency_output` and :func:`parse_latency_json`, never by
:func:`parse_output` (which refuses a latency table). Their columns are in usec;
releases before 2016 print only t_min/t_max/t_typical, duration mode (``-D``)
prints t_avg and the transaction rate. Tidy rows of a latency result are in us.

Formats seen in public outputs (tests/fixtures/lab/perftest/public): perftest 1.x
printed no MsgRate column; releases up to ~3.0 spell the header field
``Gid index``; pasted outputs often carry the header's tab runs as spaces. All of
these are read; a damaged paste (markdown markup in a number, separator lines
and ``#`` stripped, a cut row) is a ParseError naming the damaged line.
"""
from __future__ import annotations

from peercache.lab.tools.perftest.command import (SERVER_READY_PATTERN, TOOLS, PerftestParams, client_command,
                                                  sample_window, server_command, symmetric_args)
from peercache.lab.tools.perftest.failures import (CLOCK_CALIBRATION, WC_TEXT, CompletionError, classify_failure,
                                                   completion_errors, wc_status_table)
from peercache.lab.tools.perftest.jsonout import cross_check, parse_json, parse_latency_json
from peercache.lab.tools.perftest.results import (BW_UNITS, LAT_COLUMNS, PerftestLatencyResult, PerftestLatencyRow,
                                                  PerftestResult, PerftestRow)
from peercache.lab.tools.perftest.rows import to_rows
from peercache.lab.tools.perftest.text import LAT_TOOLS, parse_header, parse_latency_output, parse_output

__all__ = ["BW_UNITS", "CLOCK_CALIBRATION", "LAT_COLUMNS", "LAT_TOOLS", "SERVER_READY_PATTERN", "TOOLS", "WC_TEXT",
           "CompletionError", "PerftestLatencyResult", "PerftestLatencyRow", "PerftestParams", "PerftestResult",
           "PerftestRow", "classify_failure", "client_command", "completion_errors", "cross_check", "parse_header",
           "parse_json", "parse_latency_json", "parse_latency_output", "parse_output", "sample_window",
           "server_command", "symmetric_args", "to_rows", "wc_status_table"]
