"""The RDMA path: read planner, completion accounting, device discovery, GPU registration."""
