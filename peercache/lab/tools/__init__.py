"""Tool wrappers: pure command builders and strict parsers (perftest, perf stat, iperf3) and the memcpy limit."""
