"""The RDMA path: device discovery, work-completion status codes, GPU registration.

The read planner and the completion accounting are native (native/verbs_plan.c, native/verbs.c);
their Python oracles, which the tests compare the native code with, are in tests/oracles."""
