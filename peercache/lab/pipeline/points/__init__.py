"""One module per point kind, each holding the kind's declaration, its run, its sanity check and its metric
extraction (in the shape of ReFrame's ``osu.py``):

=====================  ================================================================
``perftest``           ib_read_bw / ib_write_bw / ib_send_bw between the hosts
``iperf3``             iperf3 over TCP (one client, or N client processes over one window)
``sockperf``           sockperf TCP ping-pong (the raw round trip)
``memcpy``             the producer's memory-copy ceiling per NUMA node (the shm limit)
``peercache``          serve and drive: GET throughput of one pair
``hicache``            the peercache pair read through SGLang HiCache's v1 path
``group``              one serve/drive pair per NIC over one shared window
``node_api``           the engine's batch API in one consumer process
``get_trace``          one-key GETs over tcp traced on both sides: where a GET's microseconds go
``dirlookup``          directory lookups/s (dirbench)
``redis_benchmark``    redis-benchmark's MGET (the raw limit of the Redis directory)
``mooncake_te``        Mooncake's transfer_engine_bench at a PeerCache point's shape (its own venv)
``peercache_pypi``     the published PeerCache 0.8.4's serve/drive at the same knobs (its own venv)
``nixl``               NIXL's nixl_agent (UCX, DRAM) through our READ driver at the same shape (its own venv)
``hicache_suite``      serve and the HiCache suite: get/set/exists sweeps through PeerCacheStore, PEAK per op
``cluster``            a shared-cache traffic pattern over N hosts (pairwise, incast, fan-out, shared), raw beside it
``growth``             how a cost grows with keys, members, pool or batch size, a power law fitted (growth)
``directory_faults``   the directory's own failure (restart, kill, stop, failover) under a verifying read
=====================  ================================================================

What every kind is made of is in :mod:`.declare`, what a kind whose point is one pair declares in
:mod:`.pairkind` and the bounds of the waits they share in :mod:`.bounds`; the shared harness a kind's
``run`` is given (launch and cleanup, the pair path from output to rows, CPU and NUMA evidence, port
counters, the result's meta) is :class:`peercache.lab.pipeline.runpoint.PointRun`. Importing this package registers every kind, in this
order (the order ``python -m peercache.lab.pipeline kinds`` lists them in).
"""
from peercache.lab.pipeline.points import perftest, iperf3, sockperf, memcpy  # noqa: F401  (registers them)
from peercache.lab.pipeline.points import peercache, hicache, group, node_api, get_trace  # noqa: F401
from peercache.lab.pipeline.points import dirlookup, redis_benchmark  # noqa: F401
from peercache.lab.pipeline.points import mooncake_te, peercache_pypi, nixl  # noqa: F401  (other engines)
from peercache.lab.pipeline.points import hicache_suite, cluster  # noqa: F401
from peercache.lab.pipeline.points import growth, directory_faults  # noqa: F401
