"""Tests of peercache.lab.analysis; the folder mirrors the package's (a package, so test modules may share a basename)."""
