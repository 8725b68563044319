"""Tests of peercache.lab.launch; the folder mirrors the package's (a package, so test modules may share a basename)."""
