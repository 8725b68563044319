"""The machine as the lab sees it: host capture, port counters, CPU and NUMA evidence, NUMA binding."""
