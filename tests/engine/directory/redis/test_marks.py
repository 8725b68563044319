"""peercache.directory.redis.marks: the publish marks by which a producer notices entries a failover
lost while its registration survived; the book alone, then against a real redis-server and a real
three-master cluster on loopback."""
from __future__ import annotations

import subprocess
import time

from redis.crc import key_slot

from conftest import scaled
from peercache.directory.redis.marks import MarkBook, keep_ms, slot_tag
from peercache.lab.launch import redis as redis_launch
from redis_fixtures import RoundTrips, producer, publish


def test_slot_tags_hash_to_their_slot():
    for slot in (0, 1, 5461, 10923, 16383):
        tag = slot_tag(slot)
        assert key_slot(f"pc:g:{{{tag}}}:node".encode()) == slot and len(tag) <= 5
    assert keep_ms(5.0) == 60000 and keep_ms(30.0) == 120000


def test_the_book_counts_marks_found_behind_once():
    b = MarkBook()
    g1 = b.next_gen("n")
    b.raised("n", ["m1", "m2"], g1, [0, 0])               # first publish: nothing before, nothing lost
    g2 = b.next_gen("n")
    b.raised("n", ["m1"], g2, [g1])
    assert g2 > g1 and b.expected("n") == {"m1": g2, "m2": g1} and b.take_lost("n") == 0
    b.read("n", b.expected("n"), [g2, g1])                 # all there
    assert b.take_lost("n") == 0
    b.read("n", b.expected("n"), [g1, 0])                  # m1 rolled back one publish, m2 gone
    assert b.take_lost("n") == 2 and b.take_lost("n") == 0
    assert b.expected("n") == {"m1": g1, "m2": 0}          # the republish starts from what is there
    g3 = b.next_gen("n")
    b.raised("n", ["m1", "m2"], g3, [g1, 0])               # ... so raising them is no second loss
    assert b.take_lost("n") == 0
    b.raised("n", ["m1"], b.next_gen("n"), [g1])           # a publish that finds its mark behind
    assert b.take_lost("n") == 1
    assert sorted(b.forget("n")) == ["m1", "m2"] and b.expected("n") == {} and b.take_lost("n") == 0


def test_one_redis_a_mark_per_node_read_by_each_heartbeat_in_its_round_trip(redis_server):
    url = redis_server.url
    d, nid, tok = producer(url)
    try:
        publish(d, nid, tok, [f"k{i}".encode() for i in range(1000)])
        mark = f"pc:g:{{{nid}}}"
        gen = int(d.r.get(mark))
        assert 0 < d.r.pttl(mark) <= keep_ms(d.heartbeat_timeout)
        trips = RoundTrips(d)
        assert d.call("heartbeat", node_id=nid, token=tok)["lost"] == 0
        assert trips.n == 1                                 # the mark costs no round trip of its own
        d.r.set(mark, gen - 1)                              # the last publish lost by a failover
        assert d.call("heartbeat", node_id=nid, token=tok)["lost"] == 1
        assert d.call("heartbeat", node_id=nid, token=tok)["lost"] == 0     # reported once
        publish(d, nid, tok, [b"after"], base=2000)         # raised again: nothing more is lost
        assert int(d.r.get(mark)) > gen and d.call("heartbeat", node_id=nid, token=tok)["lost"] == 0
        d.r.delete(mark)                                     # lost, then a publish finds it gone
        publish(d, nid, tok, [b"after2"], base=2001)
        assert d.call("heartbeat", node_id=nid, token=tok)["lost"] == 1
        d.call("leave", node_id=nid, token=tok)
        assert d.r.exists(mark) == 0                         # the node's marks go with it
    finally:
        d.close()


def _mark_keys(port: int) -> list[bytes]:
    r = subprocess.run(redis_launch.cli_command(port, "--scan", "--pattern", "pc:g:*"), capture_output=True,
                       timeout=10)
    return r.stdout.split()


def test_cluster_a_mark_per_master_in_its_first_slot_read_off_the_heartbeat(redis_cluster):
    d, nid, tok = producer(redis_cluster.url)
    try:
        publish(d, nid, tok, [f"layer/{i}".encode() for i in range(600)])    # entries on all three masters
        keys = sorted(k for p in redis_cluster.ports for k in _mark_keys(p))
        assert len(keys) == 3 and all(k.endswith(f":{nid}".encode()) for k in keys)
        firsts: dict[str, int] = {}
        for slot, nodes in sorted(d.r.nodes_manager.slots_cache.items()):
            firsts.setdefault(nodes[0].name, slot)
        assert {key_slot(k) for k in keys} == set(firsts.values())
        hb = d.clone()                                      # the heartbeat's clone reads the same marks
        try:
            assert hb.call("heartbeat", node_id=nid, token=tok)["lost"] == 0
            victim = keys[1]
            d.r.set(victim, int(d.r.get(victim)) - 1)       # one master's last publish lost
            t, lost = time.monotonic(), 0
            while not lost and time.monotonic() - t < scaled(3.0):
                lost = hb.call("heartbeat", node_id=nid, token=tok)["lost"]   # read on a helper thread,
                time.sleep(0.05)                                              # told by a later heartbeat
            assert lost == 1
        finally:
            hb.close()
    finally:
        d.close()
