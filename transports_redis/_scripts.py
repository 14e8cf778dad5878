"""Every Lua script the Redis backend runs, as data: one `Script` per operation.

A script declares the keys it touches (by suffix under the queue's hash tag) and the
names of its arguments once, beside its text; `Script.source` binds them to ``K.<name>``
and ``A.<name>`` ahead of the shared helpers, so no script indexes KEYS or ARGV by
number. Imports no driver.

Key layout of queue NAME (every key under the hash tag ``{NAME}``, so one queue lives in
one cluster slot; group ids are hash fields and set members, never part of a key):

    dt:{NAME}:seq      string  the last seq handed out (INCR; never goes back)
    dt:{NAME}:ev       hash    seq -> event JSON of each queued message
    dt:{NAME}:nx       hash    seq -> next seq of the same group (the group's chain)
    dt:{NAME}:att      hash    seq -> packed (attempt, base) of a non-head message that
                               was delivered before (a requeued one moved behind the head)
    dt:{NAME}:g        hash    group -> packed group record (see `load`)
    dt:{NAME}:busy     zset    leased or parked groups, by the end of the lease or park
    dt:{NAME}:r0..r4   zset    ready groups of each priority, in round-robin order
    dt:{NAME}:w0..w4   list    wake-up tokens for claims waiting with that floor
    dt:{NAME}:dead     hash    seq -> packed dead letter
    dt:{NAME}:deadq    zset    dead letter seqs, in seq order
    dt:{NAME}:dg       zset    dead letters by group: members `dead_member(group, seq)`,
                               all scored 0, so that a group's are one range by name
    dt:{NAME}:n        hash    counters the scripts keep, so that stats reads a few
                               fields (see `bump`): m<p>, l<p>, k<p>, d<p> per priority
    dt:{NAME}:key      hash    idempotency key -> seq of the message first published
                               with it; the field is `key_member(group, key)`
    dt:{NAME}:kx       zset    the same fields, scored by when the key is forgotten
                               (its publish's time plus the window)

Only the keyed publishes, stats and check touch the last two (`KEYED_KEYS`): a plain
publish sends the keys it always sent. Nothing else removes a key: an acked, dead or
purged message's key is a duplicate until its time is up, and the keyed publishes forget
at most `FORGET` keys each (per keyed item of a batch), oldest first, so that the keys
left behind by a burst are gone after as many keyed publishes, while a lookup treats a
key past its time as absent.

No script's cost grows with the size of the queue except CHECK (for tests): the admin
reads go through it in chunks of `chunk` items, one script each, and purge_group removes
at most `chunk` items a script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

PRIORITIES: Final = range(5)
READY_KEYS: Final = tuple(f"r{p}" for p in PRIORITIES)
WAKE_KEYS: Final = tuple(f"w{p}" for p in PRIORITIES)
QUEUE_KEYS: Final = (
    "seq", "ev", "nx", "att", "g", "busy", *READY_KEYS, *WAKE_KEYS, "dead", "deadq", "dg", "n",
)  # fmt: skip
KEYED_KEYS: Final = (*QUEUE_KEYS, "key", "kx")
# At most this many forgotten keys are removed by a keyed publish (per keyed item).
FORGET: Final = 8
# At most this many lapsed leases or ended parks are freed by one claim (the next claims
# free the rest), so that no claim runs long after a crowd of them ended at once.
SWEEP: Final = 250

# Shared by every script. Numbers handed to redis.call go through f17: Lua would format
# them with 14 significant digits, which moves a lease's end by up to a tenth of a ms.
HELPERS: Final = r"""
local NEVER = 4503599627370496
local function f17(x) return string.format('%.17g', x) end
local function clock(given)
  if given ~= nil and given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- group record: head, tail, depth, prio, att (deliveries of the head), base (att at its
-- last requeue), worker ('' when nobody holds it), due (end of lease or park, 0 none),
-- last (time of its last claim, 0 never), held (seq of the dead letter holding it, 0 none)
local function load(group)
  local packed = redis.call('HGET', K.g, group)
  if not packed then return nil end
  local r = {}
  r.head, r.tail, r.depth, r.prio, r.att, r.base, r.worker, r.due, r.last, r.held =
    cmsgpack.unpack(packed)
  return r
end
local function save(group, r)
  redis.call('HSET', K.g, group, cmsgpack.pack(
    r.head, r.tail, r.depth, r.prio, r.att, r.base, r.worker, r.due, r.last, r.held))
end
local function rkey(p) return K['r' .. p] end
-- the counters: m<p> queued messages (a dead letter holding its group not counted),
-- l<p> leased and k<p> parked groups in busy (until a claim frees them, a lapsed
-- lease or ended park too: stats takes those off), d<p> dead letters
local function bump(field, by) redis.call('HINCRBY', K.n, field, by) end
local function kind(r)
  if r.worker ~= '' then return 'l' .. r.prio end
  return 'k' .. r.prio
end
-- a dead letter's member of K.dg: its group's length first, so that a group's members
-- are exactly those between its prefix and the prefix followed by \255
local function dead_member(group, seq)
  return string.format('%08x', #group) .. group .. string.format('%016x', seq)
end
-- never-claimed groups first, by their head; then by their last claim
local function score(r)
  if r.last == 0 then return r.head - NEVER end
  return r.last
end
local function signal(upto)
  for f = 0, upto do
    local k = K['w' .. f]
    if redis.call('LLEN', k) == 0 then redis.call('RPUSH', k, '1') end
  end
end
local function make_ready(group, r)
  redis.call('ZADD', rkey(r.prio), f17(score(r)), group)
  signal(r.prio)
end
local function earliest()
  if redis.call('EXISTS', K.busy) == 0 then return nil end
  return tonumber(redis.call('ZRANGE', K.busy, 0, 0, 'WITHSCORES')[2])
end
-- a waiting claim sleeps until the earliest deadline: wake it when that moves earlier;
-- `first` is that deadline when the caller knows it already (false: look it up)
local function make_busy(group, r, first)
  if first == false then first = earliest() end
  if redis.call('ZADD', K.busy, f17(r.due), group) == 1 then bump(kind(r), 1) end
  if first == nil or first > r.due then signal(r.prio) end
end
local function unlist(group, r)
  if redis.call('ZREM', K.busy, group) == 1 then bump(kind(r), -1) end
  redis.call('ZREM', rkey(r.prio), group)
end
-- the head is done: the next message becomes the head, or the group is forgotten
local function advance(group, r)
  local head = r.head
  local nxt = redis.call('HGET', K.nx, head)
  redis.call('HDEL', K.ev, head)
  redis.call('HDEL', K.nx, head)
  r.depth = r.depth - 1
  if r.depth == 0 or not nxt then
    redis.call('HDEL', K.g, group)
    return nil
  end
  r.head = tonumber(nxt)
  local stash = redis.call('HGET', K.att, nxt)
  if stash then
    r.att, r.base = cmsgpack.unpack(stash)
    redis.call('HDEL', K.att, nxt)
  else
    r.att, r.base = 0, 0
  end
  r.worker, r.due, r.held = '', 0, 0
  save(group, r)
  return r
end
local function fenced(group, seq, worker, att)
  local r = load(group)
  if r == nil or r.head ~= tonumber(seq) or r.worker ~= worker
     or r.att ~= tonumber(att) or r.held ~= 0 then
    return nil
  end
  return r
end
-- the head becomes a dead letter; `how` 'b' keeps `text` as its reason, 'x' (out of
-- attempts) keeps what the reason is built from, in Python, by exhausted_reason
local function kill(group, r, now, how, text, last, max, on_dead)
  local raw = redis.call('HGET', K.ev, r.head)
  local held = 0
  if on_dead == 'hold' then held = 1 end
  redis.call('HSET', K.dead, r.head, cmsgpack.pack(
    group, r.prio, raw, r.att, how, text, r.att - r.base, max, last, now, held))
  redis.call('ZADD', K.deadq, r.head, r.head)
  redis.call('ZADD', K.dg, 0, dead_member(group, r.head))
  bump('m' .. r.prio, -1)
  bump('d' .. r.prio, 1)
  unlist(group, r)
  if held == 1 then
    redis.call('HDEL', K.ev, r.head)
    r.held, r.worker, r.due = r.head, '', 0
    save(group, r)
  else
    local n = advance(group, r)
    if n then make_ready(group, n) end
  end
end
-- dead letter `seq` leaves the dead letters; returns its unpacked record
local function unbury(seq)
  local d = {cmsgpack.unpack(redis.call('HGET', K.dead, seq))}
  redis.call('HDEL', K.dead, seq)
  redis.call('ZREM', K.deadq, seq)
  redis.call('ZREM', K.dg, dead_member(d[1], tonumber(seq)))
  bump('d' .. d[2], -1)
  return d
end
"""


# A message appended to its group's chain: a new group is ready at once, an existing one
# only gets a longer chain. Used by PUBLISH and PUBLISH_KEYED, ahead of their bodies.
APPEND: Final = r"""
local function append(group, prio, raw)
  local seq = redis.call('INCR', K.seq)
  redis.call('HSET', K.ev, seq, raw)
  local r = load(group)
  if r then
    redis.call('HSET', K.nx, r.tail, seq)
    r.tail, r.depth = seq, r.depth + 1
    save(group, r)
  else
    r = {head = seq, tail = seq, depth = 1, prio = tonumber(prio), att = 0, base = 0,
         worker = '', due = 0, last = 0, held = 0}
    save(group, r)
    make_ready(group, r)
  end
  bump('m' .. r.prio, 1)
  return seq
end
"""

# A batch's messages appended, their seqs consecutive from `first`: ARGV from `at`, per
# item `stride` arguments of which the first three are group, prio, raw; the items
# `skip` names (a table of 0-based indexes, or nil) are left out and take no seq. Used by
# PUBLISH_MANY and PUBLISH_MANY_KEYED, ahead of their bodies.
APPEND_MANY: Final = r"""
local function append_many(first, n, at, stride, skip)
  local cache, added, seq = {}, {}, first
  for i = 0, n - 1 do
    if not (skip and skip[i]) then
      local base = at + stride * i
      local group = ARGV[base]
      redis.call('HSET', K.ev, seq, ARGV[base + 2])
      local r = cache[group]
      if r == nil then r = load(group) end
      if r then
        redis.call('HSET', K.nx, r.tail, seq)
        r.tail, r.depth = seq, r.depth + 1
      else
        r = {head = seq, tail = seq, depth = 1, prio = tonumber(ARGV[base + 1]), att = 0,
             base = 0, worker = '', due = 0, last = 0, held = 0, new = true}
      end
      cache[group] = r
      added[r.prio] = (added[r.prio] or 0) + 1
      seq = seq + 1
    end
  end
  for group, r in pairs(cache) do
    save(group, r)
    if r.new then make_ready(group, r) end
  end
  for p, count in pairs(added) do bump('m' .. p, count) end
end
"""

# The keys' helpers, ahead of the keyed publishes' bodies. A key's field is made by the
# caller (`_ops.key_member`): its group by length first, so that no (group, key) pair
# can spell another's.
KEY_HELPERS: Final = r"""
-- the keys whose time is up at `now`, at most `limit` of them, oldest first (a thousand
-- a call: Lua's stack holds some 8,000 arguments)
local function forget(now, limit)
  while limit > 0 do
    local gone = redis.call('ZRANGEBYSCORE', K.kx, '-inf', f17(now), 'LIMIT', 0,
      math.min(limit, 1000))
    if #gone == 0 then return end
    redis.call('ZREM', K.kx, unpack(gone))
    redis.call('HDEL', K.key, unpack(gone))
    limit = limit - 1000
  end
end
-- the seq a live key points at, or nil (never used, or its time is up: absent)
local function lookup(member, now)
  local seq = redis.call('HGET', K.key, member)
  if seq and tonumber(redis.call('ZSCORE', K.kx, member)) > now then return tonumber(seq) end
  return nil
end
local function remember(member, seq, until_)
  redis.call('HSET', K.key, member, seq)
  redis.call('ZADD', K.kx, f17(until_), member)
end
-- `lookup` of many, a few calls in all: a list of seqs, false where absent. Calls take
-- a thousand arguments at most: Lua's stack holds some 8,000.
local function lookup_many(members, now)
  local found = {}
  for from = 1, #members, 1000 do
    local seqs = redis.call('HMGET', K.key, unpack(members, from, math.min(from + 999, #members)))
    for j, seq in ipairs(seqs) do
      local member = members[from + j - 1]
      if seq and tonumber(redis.call('ZSCORE', K.kx, member)) > now then
        found[from + j - 1] = tonumber(seq)
      else
        found[from + j - 1] = false
      end
    end
  end
  return found
end
-- `remember` of many: `pairs` is member, seq, member, seq ...
local function remember_many(pairs_, until_)
  local at = f17(until_)
  for from = 1, #pairs_, 1000 do
    local fields, times = {}, {}
    for j = from, math.min(from + 999, #pairs_), 2 do
      fields[#fields + 1], fields[#fields + 2] = pairs_[j], pairs_[j + 1]
      times[#times + 1], times[#times + 2] = at, pairs_[j]
    end
    redis.call('HSET', K.key, unpack(fields))
    redis.call('ZADD', K.kx, unpack(times))
  end
end
"""


@dataclass(frozen=True)
class Script:
    """One operation's Lua: the argument names it declares, its body, and the key suffixes
    it binds (keyword only: the queue's, `QUEUE_KEYS`, unless it says otherwise)."""

    name: str
    args: tuple[str, ...]
    body: str
    # Script flags (Redis 7): ``allow-oom`` for the calls that drain a full server,
    # ``no-writes`` for reads. Every script has the shebang line: without it, Redis checks
    # memory at each write inside the script and may stop one halfway.
    flags: str = ""
    keys: tuple[str, ...] = field(default=QUEUE_KEYS, kw_only=True)
    source: str = field(init=False)
    sha: str = field(init=False)
    # False for reads: a lost connection cannot have changed anything.
    writes: bool = field(init=False)

    def __post_init__(self) -> None:
        bind = [
            f"local K = {{{', '.join(f'{k} = KEYS[{i}]' for i, k in enumerate(self.keys, 1))}}}"
        ]
        bind.append(
            f"local A = {{{', '.join(f'{a} = ARGV[{i}]' for i, a in enumerate(self.args, 1))}}}"
        )
        shebang = f"#!lua flags={self.flags}" if self.flags else "#!lua"
        source = "\n".join(
            [shebang, f"-- durable-transports: {self.name}", *bind, HELPERS, self.body]
        )
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sha", hashlib.sha1(source.encode()).hexdigest())
        object.__setattr__(self, "writes", "no-writes" not in self.flags)


PUBLISH: Final = Script(
    "publish",
    ("group", "prio", "raw"),
    APPEND + "return append(A.group, A.prio, A.raw)",
)

# A key in use within the window: nothing is stored, and the reply is minus the seq of
# the message first published with it. Otherwise the message is appended and the key
# (forgotten or never used) remembered until now + window.
PUBLISH_KEYED: Final = Script(
    "publish_keyed",
    ("group", "prio", "raw", "member", "window", "now"),
    APPEND
    + KEY_HELPERS
    + r"""
local now = clock(A.now)
forget(now, FORGET)
local original = lookup(A.member, now)
if original then return -original end
local seq = append(A.group, A.prio, A.raw)
remember(A.member, seq, now + tonumber(A.window))
return seq
""".replace("FORGET", str(FORGET)),
    keys=KEYED_KEYS,
)

# ARGV after `count`: group, prio, raw for each item; seqs are consecutive from the reply.
PUBLISH_MANY: Final = Script(
    "publish_many",
    ("count",),
    APPEND_MANY
    + r"""
local n = tonumber(A.count)
local first = redis.call('INCRBY', K.seq, n) - n + 1
append_many(first, n, 2, 3, nil)
return first
""",
)

# ARGV after `count`, `window` and `now`: group, prio, raw, key field ('' for no key)
# for each item. An item whose key is in use (in the store, or by an earlier item of the batch)
# is left out; the others take consecutive seqs from the reply's first number, which
# the left-out items follow as (index from 0, the original's seq) pairs.
PUBLISH_MANY_KEYED: Final = Script(
    "publish_many_keyed",
    ("count", "window", "now"),
    APPEND_MANY
    + KEY_HELPERS
    + r"""
local n = tonumber(A.count)
local now = clock(A.now)
local members, items = {}, {}
for i = 0, n - 1 do
  local member = ARGV[7 + 4 * i]
  if member ~= '' then members[#members + 1], items[#items + 1] = member, i end
end
forget(now, FORGET * #members)
local found = lookup_many(members, now)
local skip, dups, seen, fresh = {}, {}, {}, {}
for j, member in ipairs(members) do
  local i = items[j]
  local earlier = seen[member] or found[j]
  if earlier then
    skip[i], dups[#dups + 1] = true, {i, earlier}
  else
    seen[member], fresh[#fresh + 1] = -1 - i, j  -- an item of this batch: seq below
  end
end
local ord, stored = {}, 0
for i = 0, n - 1 do
  if not skip[i] then ord[i], stored = stored, stored + 1 end
end
local first = redis.call('INCRBY', K.seq, stored) - stored + 1
append_many(first, n, 4, 4, skip)
local kept = {}
for _, j in ipairs(fresh) do
  kept[#kept + 1], kept[#kept + 2] = members[j], first + ord[items[j]]
end
remember_many(kept, now + tonumber(A.window))
local out = {first}
for _, d in ipairs(dups) do
  local seq = d[2]
  if seq < 0 then seq = first + ord[-1 - seq] end
  out[#out + 1] = d[1]
  out[#out + 1] = seq
end
return out
""".replace("FORGET", str(FORGET)),
    keys=KEYED_KEYS,
)

# Frees lapsed leases and ended parks first (their group keeps its holder, so a lapsed
# lease nobody re-claimed can still be acked), then leases the ready group whose last
# claim is oldest at or above the floor. With max_attempts, a head out of deliveries is
# made a dead letter instead and the claim goes on. Reply: {1, seq, group, raw, att,
# due} or {0, now, earliest deadline or ''}.
CLAIM: Final = Script(
    "claim",
    ("worker", "vis", "floor", "now", "max", "on_dead", "cascade", "sweep"),
    r"""
local now = clock(A.now)
local first = earliest()
if first ~= nil and first < now then
  local due = redis.call('ZRANGEBYSCORE', K.busy, '-inf', '(' .. f17(now), 'LIMIT', 0, A.sweep)
  for _, group in ipairs(due) do
    local r = load(group)
    redis.call('ZREM', K.busy, group)
    if r then
      bump(kind(r), -1)
      if r.worker == '' then r.due = 0; save(group, r) end
      redis.call('ZADD', rkey(r.prio), f17(score(r)), group)
    end
  end
  first = earliest()
end
local floor, max = tonumber(A.floor), tonumber(A.max)
while true do
  -- EXISTS first: most queues use one or two priorities, and ZRANGE costs ten times more
  local ready = {}
  for p = floor, 4 do
    if redis.call('EXISTS', rkey(p)) == 1 then ready[#ready + 1] = rkey(p) end
  end
  local best = nil
  if #ready == 1 then
    best = redis.call('ZRANGE', ready[1], 0, 0)[1]
  elseif #ready > 1 then
    local best_score = nil
    for _, k in ipairs(ready) do
      local top = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
      if best == nil or tonumber(top[2]) < best_score then
        best, best_score = top[1], tonumber(top[2])
      end
    end
  end
  if best == nil then
    local next_due = ''
    if first ~= nil then next_due = f17(first) end
    return {0, f17(now), next_due}
  end
  local r = load(best)
  if max > 0 and r.att - r.base >= max then
    local last = 'nacked'
    if r.worker ~= '' then last = 'lapsed' end
    kill(best, r, now, 'x', '', last, max, A.on_dead)
  else
    redis.call('ZREM', rkey(r.prio), best)
    r.att, r.worker, r.due, r.last = r.att + 1, A.worker, now + tonumber(A.vis), now
    save(best, r)
    make_busy(best, r, first)
    if A.cascade == '1' then
      for p = 4, 0, -1 do
        if redis.call('ZCARD', rkey(p)) > 0 then signal(p); break end
      end
    end
    return {1, r.head, best, redis.call('HGET', K.ev, r.head), r.att, f17(r.due)}
  end
end
""",
    flags="allow-oom",
)

FENCE: Final = ("group", "seq", "worker", "att")


def on_lease(name: str, params: tuple[str, ...], body: str) -> Script:
    """A script on a held lease (ack, nack, extend, bury, unclaim): its arguments are the
    lease's `FENCE` then ``params``, and ``body`` runs with ``r``, the group's record, once
    the fence has found the lease current; the reply is 0 when it is not (it lapsed and
    was claimed again, or was settled already)."""
    fence = "\nlocal r = fenced(A.group, A.seq, A.worker, A.att)\nif r == nil then return 0 end"
    return Script(name, (*FENCE, *params), fence + body, flags="allow-oom")


ACK: Final = on_lease(
    "ack",
    (),
    r"""
unlist(A.group, r)
bump('m' .. r.prio, -1)
local n = advance(A.group, r)
if n then make_ready(A.group, n) end
return 1
""",
)

# delay 0: ready again at once; else parked, its group held, until now + delay.
NACK: Final = on_lease(
    "nack",
    ("delay", "now"),
    r"""
local delay = tonumber(A.delay)
unlist(A.group, r)
r.worker = ''
if delay > 0 then
  r.due = clock(A.now) + delay
  save(A.group, r)
  make_busy(A.group, r, false)
else
  r.due = 0
  save(A.group, r)
  make_ready(A.group, r)
end
return 1
""",
)

# A claim undone (an async claim cancelled after the script leased): the head is ready
# again at once, as it was before the claim but for its place in the round-robin, and
# its next delivery carries the same attempt number, this one not counted against
# max_attempts. Reply: 1, or 0 when the lease is not current.
UNCLAIM: Final = on_lease(
    "unclaim",
    (),
    r"""
unlist(A.group, r)
r.att, r.worker, r.due = r.att - 1, '', 0
save(A.group, r)
make_ready(A.group, r)
return 1
""",
)

# Reply: the lease's new end, or 0 when the lease is lost.
EXTEND: Final = on_lease(
    "extend",
    ("vis", "now"),
    r"""
unlist(A.group, r)
r.due = clock(A.now) + tonumber(A.vis)
save(A.group, r)
make_busy(A.group, r, false)
return f17(r.due)
""",
)

BURY: Final = on_lease(
    "bury",
    ("reason", "on_dead", "now"),
    r"""
kill(A.group, r, clock(A.now), 'b', A.reason, '', 0, A.on_dead)
return 1
""",
)

# --- admin -----------------------------------------------------------------------------
# Reads write nothing. Each costs at most `chunk` items a script: an answer that needs
# more is read in several scripts, each its own consistent snapshot (see docs/redis.md).

# The counters, less the lapsed leases and ended parks that no claim has freed yet: those
# in `busy` from the cursor `after` (the member last seen, or '' to begin; `score` is its
# score, for when it has left meanwhile), `chunk` at a time. Reply: now, the member to go
# on from ('' when done) and its score, the lapsed l0..l4 and k0..k4 of this chunk, then,
# on the first call only, the counters m0..m4, l0..l4, k0..k4, d0..d4 and the keys
# remembered (those whose time is not up).
STATS: Final = Script(
    "stats",
    ("now", "after", "score", "chunk"),
    r"""
local now = clock(A.now)
local chunk = tonumber(A.chunk)
local from = 0
if A.after ~= '' then
  from = redis.call('ZRANK', K.busy, A.after)
  if from then from = from + 1 else from = redis.call('ZCOUNT', K.busy, '-inf', A.score) end
end
local lapsed, last, score = {}, '', ''
local items = redis.call('ZRANGE', K.busy, from, from + chunk - 1, 'WITHSCORES')
for i = 1, #items, 2 do
  if tonumber(items[i + 1]) >= now then last = ''; break end
  local r = load(items[i])
  if r then lapsed[kind(r)] = (lapsed[kind(r)] or 0) + 1 end
  last, score = items[i], items[i + 1]
end
if #items < 2 * chunk then last = '' end
local out = {f17(now), last, score}
for _, k in ipairs({'l', 'k'}) do
  for p = 0, 4 do out[#out + 1] = lapsed[k .. p] or 0 end
end
if A.after == '' then
  local counts = redis.call('HMGET', K.n, 'm0', 'm1', 'm2', 'm3', 'm4', 'l0', 'l1', 'l2',
    'l3', 'l4', 'k0', 'k1', 'k2', 'k3', 'k4', 'd0', 'd1', 'd2', 'd3', 'd4')
  for i = 1, 20 do out[#out + 1] = counts[i] or 0 end
  out[#out + 1] = redis.call('ZCOUNT', K.kx, '(' .. f17(now), '+inf')
end
return out
""",
    flags="no-writes",
    keys=KEYED_KEYS,
)

# Groups from the hash scan's cursor, `chunk` at a time. Reply: now, the next cursor ('0'
# when done), then for this chunk's `limit` deepest groups (ties: oldest head first):
# group, prio, depth, head, state, busy_until or '', last claim or ''.
GROUPS: Final = Script(
    "groups",
    ("limit", "now", "cursor", "chunk"),
    r"""
local now = clock(A.now)
local scan = redis.call('HSCAN', K.g, A.cursor, 'COUNT', A.chunk)
local all = scan[2]
local rows = {}
for i = 1, #all, 2 do
  local r = {}
  r.head, r.tail, r.depth, r.prio, r.att, r.base, r.worker, r.due, r.last, r.held =
    cmsgpack.unpack(all[i + 1])
  r.group, r.state, r.until_ = all[i], 'ready', ''
  if r.held ~= 0 then r.state, r.depth = 'held', r.depth - 1
  elseif r.due >= now and r.worker ~= '' then r.state, r.until_ = 'in_flight', f17(r.due)
  elseif r.due >= now and r.due > 0 then r.state, r.until_ = 'parked', f17(r.due) end
  rows[#rows + 1] = r
end
table.sort(rows, function(a, b)
  if a.depth ~= b.depth then return a.depth > b.depth end
  return a.head < b.head
end)
local out = {f17(now), scan[1]}
for i = 1, math.min(#rows, tonumber(A.limit)) do
  local r = rows[i]
  local last = ''
  if r.last ~= 0 then last = f17(r.last) end
  for _, v in ipairs({r.group, r.prio, r.depth, r.head, r.state, r.until_, last}) do
    out[#out + 1] = v
  end
end
return out
""",
    flags="no-writes",
)

# Dead letters after seq `after`, at most `count`, in seq order. Reply per dead letter:
# seq, group, prio, raw, attempts, kind, text, deliveries, max, last, dead_at, held, and
# the messages waiting behind it when it holds its group ('' otherwise).
DEAD_LETTERS: Final = Script(
    "dead_letters",
    ("after", "count"),
    r"""
local seqs = redis.call('ZRANGEBYSCORE', K.deadq, '(' .. A.after, '+inf', 'LIMIT', 0, A.count)
local out = {}
for _, seq in ipairs(seqs) do
  local d = {cmsgpack.unpack(redis.call('HGET', K.dead, seq))}
  local waiting = ''
  if d[11] == 1 then
    local r = load(d[1])
    if r and r.held == tonumber(seq) then waiting = r.depth - 1 end
  end
  d[10] = f17(d[10])
  out[#out + 1] = seq
  for i = 1, 11 do out[#out + 1] = d[i] end
  out[#out + 1] = waiting
end
return out
""",
    flags="no-writes",
)

# Back at its place in its group's chain (by seq), with a fresh allowance of deliveries.
# Reply: {1} done, {0} no such dead letter, {-1, worker, group} a lease holds the
# group, {-2, seq, group} another dead letter holds it.
REQUEUE: Final = Script(
    "requeue",
    ("seq",),
    r"""
local seq = tonumber(A.seq)
local packed = redis.call('HGET', K.dead, A.seq)
if not packed then return {0} end
local group, prio, raw, att, _, _, _, _, _, _, held = cmsgpack.unpack(packed)
local r = load(group)
if not (held == 1 and r and r.held == seq) then
  if r and r.worker ~= '' then return {-1, r.worker, group} end
  if r and r.held ~= 0 then return {-2, r.held, group} end
end
unbury(A.seq)
if held == 1 and r and r.held == seq then
  redis.call('HSET', K.ev, seq, raw)
  r.held, r.base = 0, r.att
  save(group, r)
  make_ready(group, r)
else
  redis.call('HSET', K.ev, seq, raw)
  if r == nil then
    r = {head = seq, tail = seq, depth = 1, prio = prio, att = att, base = att,
         worker = '', due = 0, last = 0, held = 0}
    save(group, r)
    make_ready(group, r)
  else
    local was_ready = redis.call('ZSCORE', rkey(r.prio), group)
    if seq < r.head then
      redis.call('HSET', K.att, r.head, cmsgpack.pack(r.att, r.base))
      redis.call('HSET', K.nx, seq, r.head)
      r.head, r.att, r.base = seq, att, att
    else
      local p = r.head
      while true do
        local nxt = redis.call('HGET', K.nx, p)
        if not nxt or tonumber(nxt) > seq or tonumber(nxt) <= p then break end
        p = tonumber(nxt)
      end
      local nxt = redis.call('HGET', K.nx, p)
      if nxt then redis.call('HSET', K.nx, seq, nxt) end
      redis.call('HSET', K.nx, p, seq)
      if p == r.tail then r.tail = seq end
      redis.call('HSET', K.att, seq, cmsgpack.pack(att, att))
    end
    r.depth = r.depth + 1
    save(group, r)
    if was_ready then make_ready(group, r) end
  end
end
bump('m' .. r.prio, 1)
return {1}
""",
)

DISCARD: Final = Script(
    "discard",
    ("seq",),
    r"""
if redis.call('HEXISTS', K.dead, A.seq) == 0 then return 0 end
local d = unbury(A.seq)
local group, held = d[1], d[11]
if held == 1 then
  local r = load(group)
  if r and r.held == tonumber(A.seq) then
    unlist(group, r)
    local n = advance(group, r)
    if n then make_ready(group, n) end
  end
end
return 1
""",
    flags="allow-oom",
)

# At most `chunk` of the group's messages from its head, and of its dead letters, up to
# seq `upto` ('' to begin: the last seq handed out, so what is published meanwhile
# stays); a leased head goes too (its holder gets LeaseLost), and what is left of the
# group is ready. Reply: how many it removed (a dead letter holding the group counted
# once), `upto`, and 1 when more is left to remove.
PURGE_GROUP: Final = Script(
    "purge_group",
    ("group", "upto", "chunk"),
    r"""
local upto = tonumber(A.upto) or tonumber(redis.call('GET', K.seq) or 0)
local budget = tonumber(A.chunk)
local removed = 0
local r = load(A.group)
if r and r.head <= upto then
  local prio, messages = r.prio, 0
  unlist(A.group, r)
  while r and r.head <= upto and budget > 0 do
    if r.held == 0 then messages = messages + 1 end
    budget = budget - 1
    r = advance(A.group, r)
  end
  if messages > 0 then bump('m' .. prio, -messages) end
  if r then make_ready(A.group, r) end
  removed = messages
end
local prefix = string.format('%08x', #A.group) .. A.group
local dead = {}
if budget > 0 then
  dead = redis.call('ZRANGEBYLEX', K.dg, '[' .. prefix, '[' .. prefix ..
    string.format('%016x', upto), 'LIMIT', 0, budget)
end
for _, member in ipairs(dead) do
  unbury(tonumber(string.sub(member, -16), 16))
  removed = removed + 1
end
local more = 0  -- messages left, or the budget spent before the dead letters' end
if (r and r.head <= upto) or budget == 0 or #dead == budget then more = 1 end
return {removed, f17(upto), more}
""",
    flags="allow-oom",
)

# Read-only: a list of broken invariants (empty when the structures are sound). Every
# group's chain reaches its tail in `depth` steps going up, every chained message but a
# held head has its event, the sets hold exactly the groups in their state, nothing is
# left over outside a chain, every dead letter is indexed by its group, and the counters
# match what they count; the keys' hash and their set by time hold the same fields, and
# each key points at a seq handed out already. It reads the whole queue in one script:
# for tests, and for queues small or quiet enough to stop the server for that long.
CHECK: Final = Script(
    "check",
    (),
    r"""
local bad = {}
local function fail(msg) bad[#bad + 1] = msg end
local all = redis.call('HGETALL', K.g)
local chained, events, links, want = {}, 0, 0, {}
local function count(field) want[field] = (want[field] or 0) + 1 end
for i = 1, #all, 2 do
  local group = all[i]
  local r = load(group)
  want['m' .. r.prio] = (want['m' .. r.prio] or 0) + r.depth
  if r.held ~= 0 then want['m' .. r.prio] = want['m' .. r.prio] - 1 end
  if redis.call('ZSCORE', K.busy, group) then count(kind(r)) end
  local seq, steps = r.head, 1
  while true do
    chained[seq] = true
    if redis.call('HEXISTS', K.ev, seq) == 1 then events = events + 1
    elseif not (seq == r.head and r.held ~= 0) then fail(group .. ': no event for ' .. seq) end
    if seq == r.tail then break end
    local nxt = redis.call('HGET', K.nx, seq)
    if not nxt or tonumber(nxt) <= seq then fail(group .. ': chain breaks at ' .. seq); break end
    links, seq, steps = links + 1, tonumber(nxt), steps + 1
  end
  if steps ~= r.depth then fail(group .. ': depth ' .. r.depth .. ' but chain ' .. steps) end
  local places = 0
  for p = 0, 4 do
    if redis.call('ZSCORE', rkey(p), group) then
      places = places + 1
      if p ~= r.prio then fail(group .. ': ready at priority ' .. p) end
    end
  end
  if redis.call('ZSCORE', K.busy, group) then places = places + 1 end
  if r.held ~= 0 and places ~= 0 then fail(group .. ': held but listed') end
  if r.held == 0 and places ~= 1 then fail(group .. ': in ' .. places .. ' sets') end
  if r.held == 0 and r.worker == '' and r.due > 0 and not redis.call('ZSCORE', K.busy, group) then
    fail(group .. ': parked but not busy')
  end
end
if redis.call('HLEN', K.ev) ~= events then fail('events outside any chain') end
if redis.call('HLEN', K.nx) ~= links then fail('links outside any chain') end
for _, k in ipairs({K.busy, K.r0, K.r1, K.r2, K.r3, K.r4}) do
  for _, group in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    if redis.call('HEXISTS', K.g, group) == 0 then fail(k .. ' lists unknown ' .. group) end
  end
end
if redis.call('HLEN', K.dead) ~= redis.call('ZCARD', K.deadq) then fail('dead index') end
if redis.call('HLEN', K.dead) ~= redis.call('ZCARD', K.dg) then fail('dead letters by group') end
local dead = redis.call('HGETALL', K.dead)
for i = 1, #dead, 2 do
  local group, prio = cmsgpack.unpack(dead[i + 1])
  count('d' .. prio)
  if not redis.call('ZSCORE', K.dg, dead_member(group, tonumber(dead[i]))) then
    fail(group .. ': dead letter ' .. dead[i] .. ' not indexed by its group')
  end
end
local have = {}
local counters = redis.call('HGETALL', K.n)
for i = 1, #counters, 2 do have[counters[i]] = tonumber(counters[i + 1]) end
for _, k in ipairs({'m', 'l', 'k', 'd'}) do
  for p = 0, 4 do
    local f = k .. p
    if (have[f] or 0) ~= (want[f] or 0) then
      fail('counter ' .. f .. ' is ' .. (have[f] or 0) .. ', the structures say ' .. (want[f] or 0))
    end
  end
end
if redis.call('HLEN', K.key) ~= redis.call('ZCARD', K.kx) then fail('keys and their times') end
local last_seq = tonumber(redis.call('GET', K.seq) or 0)
local keys = redis.call('HGETALL', K.key)
for i = 1, #keys, 2 do
  local seq = tonumber(keys[i + 1])
  if not redis.call('ZSCORE', K.kx, keys[i]) then fail('key ' .. keys[i] .. ' has no time') end
  if not seq or seq < 1 or seq > last_seq or seq % 1 ~= 0 then
    fail('key ' .. keys[i] .. ' points at ' .. keys[i + 1])
  end
end
return bad
""",
    flags="no-writes",
    keys=KEYED_KEYS,
)

# The benchmark's floor: a script that reads nothing and writes nothing.
NOTHING: Final = Script("nothing", (), "return 1", keys=())

ALL: Final = (
    PUBLISH, PUBLISH_KEYED, PUBLISH_MANY, PUBLISH_MANY_KEYED, CLAIM, ACK, NACK, UNCLAIM, EXTEND,
    BURY, STATS, GROUPS, DEAD_LETTERS, REQUEUE, DISCARD, PURGE_GROUP, CHECK,
)  # fmt: skip
