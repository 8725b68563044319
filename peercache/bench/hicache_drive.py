"""``python -m peercache.bench.hicache_drive drive|suite``: the HiCache benches' command (:mod:`peercache.bench.hicache`).

This module is only the command's name: the lab, the docs and the ``command`` of every result document
(``hicache_drive.py ...``) name it; the code is in :mod:`peercache.bench.hicache`.
"""
from __future__ import annotations

import sys

from .hicache.cli import main

if __name__ == "__main__":
    sys.exit(main())
