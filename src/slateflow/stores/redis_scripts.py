"""What a shared State keeps on Redis for one call, and the Lua scripts that change it.

Every key of a call carries the call id as a hash tag (``{call}``), so Redis Cluster keeps a
call on one slot and a script may touch all of them. For a call ``c`` under the prefix ``p``:

* ``p:{c}:h``: a hash: ``seq`` (the newest commit), ``head`` (its commit id), ``base`` (the
  seq of the last compaction);
* ``p:{c}:v``, ``p:{c}:val``, ``p:{c}:cmp``, ``p:{c}:e``: hashes by State key: the version,
  the value as JSON text, the value's canonical JSON when it differs (sorted object keys: an
  equal dict written in another order is no change), and ``[version, seq, at_ns, source,
  writer, confidence, meta]``;
* ``p:{c}:log``: a stream, one entry per commit, its id ``<seq>-0``, fields ``c`` (the commit
  as JSON, the same array a SQLite store keeps), ``i`` (its commit id), ``p`` (the commit id
  before it: a replica that finds a ``p`` it did not apply last has a history it cannot
  account for);
* ``p:{c}:ids``: a hash, commit id to seq: a commit sent again (its reply was lost) is not
  applied twice;
* ``p:{c}:base``: the entries as of the last compaction (JSON), for history reads;
* ``p:{c}:ckpt``: a hash of workflow checkpoints;
* the channel ``p:{c}:n``: every commit is published on it (sharded pub/sub) as
  ``<seq> <id> <prev> <commit JSON>``.

Values travel as the JSON text the client encoded; a script compares and concatenates them but
never decodes one, so a value is stored exactly as it was written.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMMIT", "COMPACT", "SNAPSHOT", "CallKeys", "check_call_id"]

# Commit ids of the last KEEP_IDS commits stay known (a reply lost and the commit sent again
# within them is recognised); older ones are forgotten, a thousand at a time.
KEEP_IDS = 8192

# A commit's reply carries up to this many commits the proposer had not applied yet (another
# process's, usually still on their way through the follower): no round trip to fetch them.
SEND_MISSED = 16

COMMIT = """
local h, vk, valk, cmpk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ek, log, ids = KEYS[5], KEYS[6], KEYS[7]
local cid, at, origin = ARGV[1], ARGV[2], ARGV[3]
local seen = redis.call('HGET', ids, cid)
if seen then
  local found = redis.call('XRANGE', log, seen .. '-0', seen .. '-0')
  if #found == 0 then return {'dup', seen, false} end
  local fields = found[1][2]
  for f = 1, #fields, 2 do
    if fields[f] == 'c' then return {'dup', seen, fields[f + 1]} end
  end
  return {'dup', seen, false}
end
local i = 6
for c = 1, tonumber(ARGV[5]) do
  local key, want = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local have = tonumber(redis.call('HGET', vk, key) or '0')
  if have ~= want then
    return {'conflict', key, have, redis.call('HGET', valk, key) or false}
  end
end
local last = tonumber(redis.call('HGET', h, 'seq') or '0')
local prev = redis.call('HGET', h, 'head') or ''
local seq = last + 1
local n = tonumber(ARGV[i])
i = i + 1
local parts, versions = {}, {}
for c = 1, n do
  local key, kj, vj = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local cj, st, flag = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  i = i + 6
  local have = tonumber(redis.call('HGET', vk, key) or '0')
  if vj == '' then
    if have > 0 then
      redis.call('HDEL', vk, key)
      redis.call('HDEL', valk, key)
      redis.call('HDEL', cmpk, key)
      redis.call('HDEL', ek, key)
      parts[#parts + 1] = '[' .. kj .. ',null,0,' .. st .. ']'
      versions[c] = 0
    else
      versions[c] = -1
    end
  else
    local same = false
    if have > 0 and flag ~= 'r' then
      local old = redis.call('HGET', cmpk, key) or redis.call('HGET', valk, key)
      if cj == '' then same = (old == vj) else same = (old == cj) end
    end
    if same then
      versions[c] = -1
    else
      local version = have + 1
      redis.call('HSET', vk, key, version)
      redis.call('HSET', valk, key, vj)
      if cj == '' then redis.call('HDEL', cmpk, key) else redis.call('HSET', cmpk, key, cj) end
      redis.call('HSET', ek, key, '[' .. version .. ',' .. seq .. ',' .. at .. ',' .. st .. ']')
      parts[#parts + 1] = '[' .. kj .. ',' .. vj .. ',' .. version .. ',' .. st .. ']'
      versions[c] = version
    end
  end
end
if #parts == 0 then return {'noop', last, prev} end
local commit = '[' .. seq .. ',' .. at .. ',' .. origin .. ',[' .. table.concat(parts, ',') .. ']]'
redis.call('XADD', log, seq .. '-0', 'c', commit, 'i', cid, 'p', prev)
redis.call('HSET', h, 'seq', seq, 'head', cid)
redis.call('HSET', ids, cid, seq)
if seq % 1024 == 0 and seq > KEEP then
  local old = redis.call('XRANGE', log, '-', (seq - KEEP) .. '-0', 'COUNT', 1024)
  for e = 1, #old do
    local fields = old[e][2]
    for f = 1, #fields, 2 do
      if fields[f] == 'i' then redis.call('HDEL', ids, fields[f + 1]) end
    end
  end
end
redis.call('SPUBLISH', ARGV[#ARGV], seq .. ' ' .. cid .. ' ' .. prev .. ' ' .. commit)
local out = {'ok', seq, prev}
for c = 1, n do out[#out + 1] = versions[c] end
local after = tonumber(ARGV[4])
if after < seq - 1 and seq - 1 - after <= MISSED then
  local missed = redis.call('XRANGE', log, (after + 1) .. '-0', (seq - 1) .. '-0')
  for e = 1, #missed do
    local f, got = missed[e][2], {}
    for k = 1, #f, 2 do got[f[k]] = f[k + 1] end
    local s = string.match(missed[e][1], '^(%d+)')
    out[#out + 1] = s .. ' ' .. got['i'] .. ' ' .. got['p'] .. ' ' .. got['c']
  end
end
return out
""".replace("KEEP", str(KEEP_IDS)).replace("MISSED", str(SEND_MISSED))
"""KEYS: h, v, val, cmp, e, log, ids. ARGV: commit id, at_ns, origin (JSON), the seq the
proposer has applied, the number of version checks and ``key, version`` for each, the number of
changes and ``key, key JSON, value JSON ('' removes), canonical JSON ('' when the value's
own), stamp JSON fragment, flag ('r': write even if unchanged)`` for each, then the channel.
Returns ``{'ok', seq, prev, version per change (-1: unchanged, 0: removed), then each commit
after the proposer's seq and before this one as published (when at most SEND_MISSED)}``,
``{'noop', seq, head}``, ``{'conflict', key, version, value JSON or nil}`` or ``{'dup', seq,
commit JSON}``."""

SNAPSHOT = """
local meta = redis.call('HMGET', KEYS[1], 'seq', 'head')
local entries, values = redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])
return {meta[1] or '0', meta[2] or '', entries, values}
"""
"""KEYS: h, e, val. Returns ``{seq, head, e as a flat list, val as a flat list}``, read at one
moment."""

COMPACT = """
local upto = tonumber(ARGV[1])
local head = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if upto > head then return 0 end
local old = redis.call('XRANGE', KEYS[2], '-', upto .. '-0')
for e = 1, #old do
  local fields = old[e][2]
  for f = 1, #fields, 2 do
    if fields[f] == 'i' then redis.call('HDEL', KEYS[3], fields[f + 1]) end
  end
end
redis.call('SET', KEYS[4], ARGV[2])
redis.call('HSET', KEYS[1], 'base', upto)
redis.call('XTRIM', KEYS[2], 'MINID', (upto + 1) .. '-0')
return #old
"""
"""KEYS: h, log, ids, base. ARGV: the seq compacted to, the entries as of it (JSON). Drops the
commits up to it and their ids."""


def check_call_id(call_id: object) -> str:
    """``call_id`` if it can name a call on Redis (a non-empty str without braces or spaces),
    else ``ValueError`` saying what is wrong."""
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"a call id is a non-empty str, got {call_id!r}")
    bad = next((ch for ch in call_id if ch in "{} " or not ch.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"call id {call_id!r} holds {bad!r}: use letters, digits and punctuation other than "
            "braces (the id becomes a Redis Cluster hash tag)"
        )
    return call_id


@dataclass(frozen=True, slots=True)
class CallKeys:
    """The Redis keys of one call (see the module)."""

    head: str
    versions: str
    values: str
    canonical: str
    entries: str
    log: str
    ids: str
    base: str
    checkpoints: str
    channel: str

    @classmethod
    def of(cls, prefix: str, call_id: str) -> CallKeys:
        """The keys of ``call_id`` under ``prefix``."""
        tag = f"{prefix}:{{{check_call_id(call_id)}}}"
        return cls(
            head=f"{tag}:h",
            versions=f"{tag}:v",
            values=f"{tag}:val",
            canonical=f"{tag}:cmp",
            entries=f"{tag}:e",
            log=f"{tag}:log",
            ids=f"{tag}:ids",
            base=f"{tag}:base",
            checkpoints=f"{tag}:ckpt",
            channel=f"{tag}:n",
        )

    @property
    def commit_keys(self) -> tuple[str, ...]:
        """The KEYS of :data:`COMMIT`."""
        return (
            self.head,
            self.versions,
            self.values,
            self.canonical,
            self.entries,
            self.log,
            self.ids,
        )
