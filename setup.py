"""Build configuration that pyproject.toml cannot express (the native module)."""
from setuptools import setup

setup()
