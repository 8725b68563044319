"""``python -m peercache.lab.pipeline``: validate, capture, measure (see plan.main)."""
import sys

from peercache.lab.pipeline.plan import main

sys.exit(main())
