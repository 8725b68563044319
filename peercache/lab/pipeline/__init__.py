"""Definitions (testbeds, scenarios, points), the plan the Snakefile uses, and the point runner."""
