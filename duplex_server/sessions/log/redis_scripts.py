"""The Lua scripts of the Redis log: each check-and-write runs atomically.

Every script touches only one session's keys, which share the hash tag
``{session_id}``, so each runs unchanged on Redis Cluster. Keys, in order:
meta (hash), log (stream), bulk (hash), event ids (sorted set), lease
(string with TTL), handoff request (string with TTL).

Errors are replies whose first word the Python side maps to an exception:
UNKNOWN, STALE <fence>, SEQ <last_seq>, DUP <event_id>.
"""

from __future__ import annotations

import hashlib


class LuaScript:
    """A script's text and the SHA-1 that ``EVALSHA`` calls it by."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


# ARGV: fence, first_seq, count, ts_ms, closes (0/1), event id window,
# retry (0/1: this batch was sent before and its reply was lost), the
# batch's latest snapshot seq (0 = none: kept in meta's snapshot_seq), then
# per record: event_id ('' = none), blob, payload field ('' = none), payload,
# audio field ('' = none), audio.
APPEND = LuaScript("""
local meta, log, bulk, eids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local fence = tonumber(ARGV[1])
local first = tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local head = redis.call('HMGET', meta, 'fence', 'last_seq')
if not head[1] then return redis.error_reply('UNKNOWN') end
local current, last = tonumber(head[1]), tonumber(head[2])
if fence < current then return redis.error_reply('STALE ' .. current) end
if first ~= last + 1 then
  -- A retry of a batch that did land (the reply was lost) succeeds again.
  if ARGV[7] == '1' and first + count - 1 <= last then
    local entry = redis.call('XRANGE', log, first .. '-0', first .. '-0')
    if entry[1] and entry[1][2][2] == ARGV[10] and entry[1][2][4] == ARGV[1] then
      return first + count - 1
    end
  end
  return redis.error_reply('SEQ ' .. last)
end
local base = 9
for i = 0, count - 1 do
  local event_id = ARGV[base + i * 6]
  if event_id ~= '' then
    local landed = redis.call('ZSCORE', eids, event_id)
    if landed then return redis.error_reply('DUP ' .. landed .. ' ' .. event_id) end
  end
end
local with_ids = false
for i = 0, count - 1 do
  local at = base + i * 6
  local seq = first + i
  redis.call('XADD', log, seq .. '-0', 'r', ARGV[at + 1], 'f', ARGV[1])
  if ARGV[at + 2] ~= '' then redis.call('HSET', bulk, ARGV[at + 2], ARGV[at + 3]) end
  if ARGV[at + 4] ~= '' then redis.call('HSET', bulk, ARGV[at + 4], ARGV[at + 5]) end
  if ARGV[at] ~= '' then
    redis.call('ZADD', eids, seq, ARGV[at])
    with_ids = true
  end
end
if with_ids then redis.call('ZREMRANGEBYRANK', eids, 0, -(tonumber(ARGV[6]) + 1)) end
redis.call('HSET', meta, 'last_seq', first + count - 1, 'last_ts_ms', ARGV[4])
if ARGV[5] == '1' then redis.call('HSET', meta, 'closed', 1) end
if ARGV[8] ~= '0' then redis.call('HSET', meta, 'snapshot_seq', ARGV[8]) end
return first + count - 1
""")

# KEYS: meta, lease, want. ARGV: owner, ttl_ms, expected fence ('' = any),
# handoff (0/1). Returns {1, fence} or {0, holder, ttl_ms}.
ACQUIRE = LuaScript("""
local meta, lease, want = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl = ARGV[1], ARGV[2]
local fence = redis.call('HGET', meta, 'fence')
if not fence then return redis.error_reply('UNKNOWN') end
fence = tonumber(fence)
if ARGV[3] ~= '' and tonumber(ARGV[3]) ~= fence then
  return redis.error_reply('STALE ' .. fence)
end
local holder = redis.call('GET', lease)
if holder and holder ~= owner then
  if ARGV[4] == '1' then redis.call('SET', want, owner, 'PX', ttl) end
  return {0, holder, redis.call('PTTL', lease)}
end
fence = fence + 1
redis.call('HSET', meta, 'fence', fence, 'owner', owner)
redis.call('SET', lease, owner, 'PX', ttl)
if redis.call('GET', want) == owner then redis.call('DEL', want) end
return {1, fence}
""")

# KEYS: meta, lease, want. ARGV: owner, fence, ttl_ms.
# Returns 1 (held, extended), 0 (lost: a newer fence), 2 (handoff asked).
RENEW = LuaScript("""
local meta, lease, want = KEYS[1], KEYS[2], KEYS[3]
local fence = redis.call('HGET', meta, 'fence')
if not fence or fence ~= ARGV[2] then return 0 end
local asker = redis.call('GET', want)
if asker and asker ~= ARGV[1] then return 2 end
redis.call('SET', lease, ARGV[1], 'PX', ARGV[3])
return 1
""")

# KEYS: meta, lease. ARGV: owner, fence.
RELEASE = LuaScript("""
if redis.call('GET', KEYS[2]) == ARGV[1] and redis.call('HGET', KEYS[1], 'fence') == ARGV[2] then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
""")

# Drop bulk fields <prefix><n> for n in (mark, upto], where meta[mark_field]
# remembers how far an earlier call went (retention walks forward only), and
# the sealed references <PREFIX><n> that stand for such values (sessions/log/media.py).
# KEYS: meta, bulk. ARGV: mark field, field prefix, upto. Returns fields dropped.
DROP_BULK = LuaScript("""
local meta, bulk = KEYS[1], KEYS[2]
local done = tonumber(redis.call('HGET', meta, ARGV[1]) or '0')
local upto = tonumber(ARGV[3])
if upto <= done then return 0 end
local dropped = 0
local fields = {}
local sealed = string.upper(ARGV[2])
for n = done + 1, upto do
  fields[#fields + 1] = ARGV[2] .. n
  fields[#fields + 1] = sealed .. n
  if #fields >= 1000 then
    dropped = dropped + redis.call('HDEL', bulk, unpack(fields))
    fields = {}
  end
end
if #fields > 0 then dropped = dropped + redis.call('HDEL', bulk, unpack(fields)) end
redis.call('HSET', meta, ARGV[1], upto)
return dropped
""")

# A segment is durable: each bulk value <prefix><n> still present is swapped
# for its reference <PREFIX><n>. A value dropped meanwhile (trimmed, compacted)
# stays dropped. KEYS: bulk. ARGV: field, reference, field, reference, ...
SWAP_BULK = LuaScript("""
local bulk = KEYS[1]
local swapped = 0
for i = 1, #ARGV, 2 do
  if redis.call('HDEL', bulk, ARGV[i]) == 1 then
    redis.call('HSET', bulk, string.upper(ARGV[i]), ARGV[i + 1])
    swapped = swapped + 1
  end
end
return swapped
""")

# Old records are in an archive segment now (sessions/log/redis_archive.py):
# trim them off the stream, drop their bulk fields, list the segment. Only if
# no other archive ran since the caller read archived_upto.
# KEYS: meta, log, bulk, archive. ARGV: archived_upto read, last seq archived,
# the archive list's entry, then the bulk fields to drop.
ARCHIVE = LuaScript("""
local meta, log, bulk, archive = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local done = tonumber(redis.call('HGET', meta, 'archived_upto') or '0')
if done ~= tonumber(ARGV[1]) then return 0 end
redis.call('XTRIM', log, 'MINID', (tonumber(ARGV[2]) + 1) .. '-0')
local fields = {}
for i = 4, #ARGV do
  fields[#fields + 1] = ARGV[i]
  if #fields == 1000 then
    redis.call('HDEL', bulk, unpack(fields))
    fields = {}
  end
end
if #fields > 0 then redis.call('HDEL', bulk, unpack(fields)) end
redis.call('RPUSH', archive, ARGV[3])
redis.call('HSET', meta, 'archived_upto', ARGV[2])
return 1
""")

ALL = (APPEND, ACQUIRE, RENEW, RELEASE, DROP_BULK, SWAP_BULK, ARCHIVE)
