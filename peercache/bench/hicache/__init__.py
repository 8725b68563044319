"""The HiCache benches: PeerCacheStore driven through SGLang's HiCache v1 path (run as
``python -m peercache.bench.hicache_drive drive|suite``). Its modules import one way:

- :mod:`.store`: the bench's store over serve's keys, the ``page_first`` host pool, SGLang's storage config;
- :mod:`.drive`: drive's processes and window, each batch one ``batch_get_v1`` (uses store);
- :mod:`.suite`: get/set/exists sweeps with PEAK rows, as SGLang's cache controller calls the store (uses store);
- :mod:`.cli`: the parser and ``main`` of both (uses drive and suite).
"""
