"""Tests of peercache.lab.pipeline.points; the folder mirrors the package's (a package, so test modules may share a basename)."""
