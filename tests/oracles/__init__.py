"""Python oracles of native fast paths: the same rules as the C code, kept only for the tests
to compare the native code against (no production path imports them).

- ``rdma_plan``: the RDMA read planner (native/verbs_plan.c).
- ``rdma_completion``: the completion accounting of the verbs backend (native/verbs.c).
- ``tcp_client``: the tcp data path's wire, handshake and client (native/tcp.c's twin).
- ``checksum``: the slot payload checksum (native/checksum.c's XXH3, through the ``xxhash`` package).
"""
