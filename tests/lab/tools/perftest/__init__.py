"""Tests of peercache.lab.tools.perftest; the folder mirrors the package's (a package, so test modules may share a basename)."""
