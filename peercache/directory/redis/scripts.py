"""The Redis directory's server-side Lua scripts, and how they are loaded.

Each script runs atomically inside Redis on keys of one hash slot (a cluster routes an EVALSHA
by its keys). Publish, take-over and unpublish write or delete an entry only when it is absent
or owned by the caller (the owner is the member number a record starts with); the others keep
a node's registration, heartbeat and membership.
"""
from __future__ import annotations

from ..location import RECORD

# An entry's owner: the member number (4 bytes) its record starts with; false for a value that is
# not a record (an older PeerCache's, or garbage), which belongs to nobody.
_OWNER = "local function owner(v) if #v == %d then return string.sub(v, 1, 4) end return false end\n" % RECORD.size

#: KEYS: entries of one hash slot; ARGV[1] = the publisher's number (4 bytes), ARGV[1 + i] = the
#: record of KEYS[i]. Per key: 0 = written, else the number of the other node that owns it (left alone).
PUBLISH_LUA = _OWNER + """
local me, out = ARGV[1], {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  local o = v and owner(v)
  if o and o ~= me then out[i] = o
  else redis.call('SET', k, ARGV[i + 1]); out[i] = 0 end
end
return out
"""

#: KEYS: entries of one slot; ARGV[1] = publisher's number, then per key (its dead owner's number
#: seen, record). Per key 1 = taken over (still that dead node's, or nobody's), 0 = someone else's now.
TAKEOVER_LUA = _OWNER + """
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  local o = v and owner(v)
  if (not o) or o == ARGV[2 * i] or o == ARGV[1] then
    redis.call('SET', k, ARGV[2 * i + 1]); out[i] = 1
  else out[i] = 0 end
end
return out
"""

#: KEYS: entries of one slot; ARGV[1] = the node's number; deletes those it owns (and values that
#: are nobody's); returns how many.
UNPUBLISH_LUA = _OWNER + """
local n = 0
for _, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v and (owner(v) == ARGV[1] or not owner(v)) then redis.call('DEL', k); n = n + 1 end
end
return n
"""

#: KEYS: node hash, token record. ARGV: token, info, ttl ms, token keep s.
#: 1 = registered; 0 = the id is another node's (its token differs).
REGISTER_LUA = """
local t = redis.call('GET', KEYS[2])
if t and t ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'info', ARGV[2], 'token', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[4])
return 1
"""

#: KEYS: node hash, owned set, token record. ARGV: token, ttl ms, owned-set ttl ms, token keep s.
#: 1 = renewed; 0 = unknown (register again); -1 = wrong token.
HEARTBEAT_LUA = """
local t = redis.call('HGET', KEYS[1], 'token')
if not t then
  local r = redis.call('GET', KEYS[3])
  if r and r ~= ARGV[1] then return -1 end
  return 0
end
if t ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[4])
return 1
"""

#: KEYS: members set, alive zset, epoch, id -> number hash, number -> id hash, number counter.
#: ARGV: id, wall-clock expiry, max nodes, a random counter seed. {new epoch, the member's number}
#: (kept while it is a member, else the next of the counter); {-1, 0} when the directory already has
#: max nodes, {-2, 0} when the numbers ran out.
JOIN_LUA = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return {-1, 0}
end
local num = redis.call('HGET', KEYS[4], ARGV[1])
if not num then
  redis.call('SET', KEYS[6], ARGV[4], 'NX')
  num = redis.call('INCR', KEYS[6])
  if num >= 4294967295 then return {-2, 0} end
  redis.call('HSET', KEYS[4], ARGV[1], num)
  redis.call('HSET', KEYS[5], num, ARGV[1])
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return {redis.call('INCR', KEYS[3]), tonumber(num)}
"""

#: KEYS: id -> number hash, number -> id hash. ARGV: id, its number. Forgets the number (after the
#: node's entries were deleted); a number is never given again.
FORGET_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[2], ARGV[2]) end
return 1
"""

#: KEYS: members set, alive zset, epoch. ARGV: id. The new epoch if this call removed the
#: member (the caller then deletes its entries), else 0.
DROP_LUA = """
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then return redis.call('INCR', KEYS[3]) end
return 0
"""

#: KEYS: one key of the slot whose server's clock is meant (a cluster routes the script there).
#: Redis's own clock in milliseconds: the one clock that every sender and the serving node of an
#: extra op share, so a request's expiry never compares two hosts' wall clocks.
NOW_MS_LUA = """
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


#: KEYS: one publish mark (see :mod:`.marks`). ARGV: the publish's generation, the mark's TTL in ms.
#: Raises the mark to the generation (a mark only grows, whichever publish lands first) and renews
#: its TTL; returns what the mark held before (0: nothing).
MARK_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return cur
"""

#: KEYS: one publish mark. ARGV: its TTL in ms. What the mark holds (0: nothing), its TTL renewed.
READ_MARK_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return cur
"""


#: Every script by the name :meth:`RedisConnection._evalsha` runs it under.
SCRIPTS = {"publish": PUBLISH_LUA, "takeover": TAKEOVER_LUA, "unpublish": UNPUBLISH_LUA,
           "register": REGISTER_LUA, "heartbeat": HEARTBEAT_LUA, "join": JOIN_LUA, "drop": DROP_LUA,
           "forget": FORGET_LUA, "now_ms": NOW_MS_LUA, "mark": MARK_LUA, "read_mark": READ_MARK_LUA}


def load_script(r, src: str, cluster: bool) -> str:
    """The SHA of ``src`` after SCRIPT LOAD into ``r``; on a cluster on every primary, so an
    EVALSHA routed anywhere finds it."""
    if cluster:
        sha = None
        for node in r.get_primaries():
            sha = r.get_redis_connection(node).script_load(src)
        return sha
    return r.script_load(src)
