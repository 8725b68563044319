"""A QEMU guest with Debian's stock kernel and Soft-RoCE (rdma_rxe): real verbs on a machine without RDMA."""
