"""Tests of peercache.lab; the folder mirrors the package's (a package, so test modules may share a basename)."""
