"""Every Lua script the Redis backend runs, as data: one `Script` per operation.

A script declares the keys it touches (by suffix under the queue's hash tag) and the
names of its arguments once, beside its text; `Script.source` binds them to ``K.<name>``
and ``A.<name>`` ahead of the shared helpers, so no script indexes KEYS or ARGV by
number. `LIBRARY` holds them all as the functions of one Redis Functions library, which
the runners call (FCALL) unless the server refuses it. Imports no driver.

Key layout of queue NAME (every key under the hash tag ``{NAME}``, so one queue lives in
one cluster slot; group ids are hash fields and set members, never part of a key):

    dt:{NAME}:seq      string  the last seq handed out (INCR; never goes back)
    dt:{NAME}:ev       hash    seq -> each queued message as the client stores it: byte 1,
                               its own priority (one digit), its group's length (8 hex
                               digits), its group, then its event's JSON (a message
                               stored before timers: the JSON alone; see `owner`)
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
    dt:{NAME}:td       hash    t<seq> -> packed delayed message waiting apart (see
                               `TIMERS`); h<seq> -> due time of a hold-delayed one
    dt:{NAME}:tm       zset    delayed messages waiting apart (hex seq), by due time
    dt:{NAME}:tg       zset    the same by group, then due time, all scored 0
    dt:{NAME}:hz       zset    hold-delayed messages (hex seq), by priority then due
                               (see `hold_score`)
    dt:{NAME}:pz       set     paused groups
    dt:{NAME}:tq       zset    ready groups of a tenant, by priority, tenant, then score
                               (see `tmember`), all scored 0
    dt:{NAME}:tc       hash    "<priority>:<tenant>" -> its ready groups
    dt:{NAME}:tp       hash    V, the tenants' passes and the highest (see `TURNS`)
    dt:{NAME}:tw       hash    w<tenant> -> its weight (1 unless set), n<tenant> -> its
                               groups
    dt:{NAME}:rt       zset    every queued message (a dead letter holding its group
                               not included), `ready_member(seq, group)`, by its
                               group's priority then the time it became ready (see
                               `ready_score`), for the backlog's age in stats
    dt:{NAME}:hg       zset    groups held by a dead letter, all scored 0, for stats

A queue stored before the nine keys from `tm` to `tw` existed works as it was: each is
created when first needed, and a group record without their fields reads as the
defaults. The last two index what is queued already: a queue stored before them is
upgraded by `UPGRADE`, which every handle runs before its first call (field v of `n`
says it is done, `VERSION`).

Only the keyed publishes, stats and check touch the last two (`KEYED_KEYS`): a plain
publish sends the keys it always sent. Nothing else removes a key: an acked, dead or
purged message's key is a duplicate until its time is up, and the keyed publishes forget
at most `FORGET` keys each (per keyed item of a batch), oldest first, so that the keys
left behind by a burst are gone after as many keyed publishes, while a lookup treats a
key past its time as absent.

No script's cost grows with the size of the queue except CHECK (for tests), CANCEL
(which walks its message's group up to it) and, with tenants, a claim (with the number
of tenants that have ready groups): the admin reads go through it in chunks of `chunk`
items, one script each, and purge_group removes at most `chunk` items a script.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from dataclasses import dataclass, field
from typing import Final

from transports_core.backend import TURN_STEP

PRIORITIES: Final = range(5)
READY_KEYS: Final = tuple(f"r{p}" for p in PRIORITIES)
WAKE_KEYS: Final = tuple(f"w{p}" for p in PRIORITIES)
QUEUE_KEYS: Final = (
    "seq", "ev", "nx", "att", "g", "busy", *READY_KEYS, *WAKE_KEYS, "dead", "deadq", "dg", "n",
    "tm", "tg", "td", "hz", "pz", "tq", "tc", "tp", "tw", "rt", "hg",
)  # fmt: skip
# The stored format's version, in field v of `n` once `UPGRADE` has indexed a queue's
# messages in `rt` and its held groups in `hg` (2: a queue stored before had no v).
VERSION: Final = 2
KEYED_KEYS: Final = (*QUEUE_KEYS, "key", "kx")
# At most this many forgotten keys are removed by a keyed publish (per keyed item).
FORGET: Final = 8
# At most this many due delayed messages join their groups in one claim or publish (the
# next ones promote the rest).
PROMOTE: Final = 100
# At most this many lapsed leases or ended parks are freed by one claim (the next claims
# free the rest), so that no claim runs long after a crowd of them ended at once.
SWEEP: Final = 250

# A group record `packed` unpacked as `r` (see `load`), in the scripts that read one.
UNPACK_GROUP: Final = """local head, tail, depth, prio, att, base, worker, due, last, held, tenant,
    paused, hold, holds = cmsgpack.unpack(packed)
  -- one constructor: a table filled field by field grows (and rehashes) four times
  local r = {head = head, tail = tail, depth = depth, prio = prio, att = att, base = base,
    worker = worker, due = due, last = last, held = held, tenant = tenant or '',
    paused = paused or 0, hold = hold or 0, holds = holds or 0}"""

# What a new group's first record carries after its fields: a string that msgpack
# reads as one value more, and which makes the record longer than the 64 bytes
# (`hash-max-listpack-value`) up to which Redis keeps a hash as a flat list. The group
# hash `g`, read and written by every claim and every settle, is then a hash table from
# its first group on: in a flat list each HGET and HSET scans up to 512 groups
# (`hash-max-listpack-entries`), the largest cost of a claim and ack on a queue of a
# few hundred groups. The next save of the group drops it.
GROUP_PAD: Final = "'\\217@" + "-" * 64 + "'"

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
-- last (time of its last claim, 0 never), held (seq of the dead letter holding it, 0 none),
-- tenant ('' none), paused (1 while paused), hold (1 while its head is a hold-delayed
-- message not yet freed: `due` is then its due time), holds (its hold-delayed messages).
-- A record stored before the last four existed unpacks them as nil: the defaults.
local function load(group)
  local packed = redis.call('HGET', K.g, group)
  if not packed then return nil end
  UNPACK_GROUP
  return r
end
local function save(group, r)
  redis.call('HSET', K.g, group, cmsgpack.pack(
    r.head, r.tail, r.depth, r.prio, r.att, r.base, r.worker, r.due, r.last, r.held,
    r.tenant, r.paused, r.hold, r.holds) .. (r.pad or ''))
end
-- a group's prefix in the members that name it first: its length, then itself, so that
-- a group's members are one range by name
local function gprefix(group) return string.format('%08x', #group) .. group end
local function hex(seq) return string.format('%016x', seq) end
-- a hold-delayed message's score in hz: its priority's band, then its due time (one
-- band spans some 2,000 years either side of 0)
local BAND = 2 ^ 37
local function hold_score(prio, due) return prio * BAND + due end
-- a queued message in rt: its seq, then its group (so that stats needs no other read to
-- find its group), scored by its group's priority band, then when it became ready
local function ready_member(seq, group) return hex(seq) .. group end
local function ready_score(prio, since) return hold_score(prio, since) end
local function now_ready(group, prio, seq, since)
  redis.call('ZADD', K.rt, f17(ready_score(prio, since)), ready_member(seq, group))
end
local function not_ready(group, seq) redis.call('ZREM', K.rt, ready_member(seq, group)) end
-- 8 bytes whose byte order is x's order as a number, so that a member can be sorted by
-- a time inside a range of names
local function sortable(x)
  if x == 0 then x = 0 end  -- -0.0 would set the byte below past 255
  local b = struct.pack('>d', x)
  if x > 0 then return string.char(string.byte(b, 1) + 128) .. string.sub(b, 2) end
  return (string.gsub(b, '.', function(c) return string.char(255 - string.byte(c)) end))
end
-- past every member of a range named by its prefix (a name and a time)
local TOP = '\255\255\255\255\255\255\255\255\255'
-- A priority's digit, for the names built from one: Lua formats a number it joins to a
-- string with sprintf, which costs more than the rest of the join.
local DIGIT = {[0] = '0', '1', '2', '3', '4'}
local function rkey(p) return K['r' .. DIGIT[p]] end
-- the counters: m<p> queued messages (a dead letter holding its group not counted),
-- l<p> leased and k<p> parked groups in busy (until a claim frees them, a lapsed
-- lease or ended park too: stats takes those off), d<p> dead letters
-- (a number passed to redis.call is formatted with sprintf too: the usual steps are
-- passed as strings)
local STEP = {[1] = '1', [-1] = '-1'}
local function bump(field, by) redis.call('HINCRBY', K.n, field, STEP[by] or by) end
-- h<p>: groups whose hold-delayed head is not due yet (busy as parked ones are, but
-- counted as delayed); t<p>: delayed messages waiting apart, in tm
local function kind(r)
  if r.worker ~= '' then return 'l' .. DIGIT[r.prio] end
  if r.hold == 1 then return 'h' .. DIGIT[r.prio] end
  return 'k' .. DIGIT[r.prio]
end
-- a dead letter's member of K.dg: its group's length first, so that a group's members
-- are exactly those between its prefix and the prefix followed by \255
local function dead_member(group, seq)
  return gprefix(group) .. hex(seq)
end
-- never-claimed groups first, by their head; then by their last claim
local function score(r)
  if r.last == 0 then return r.head - NEVER end
  return r.last
end
local function signal(upto)
  for f = 0, upto do
    local k = K['w' .. DIGIT[f]]
    if redis.call('LLEN', k) == 0 then redis.call('RPUSH', k, '1') end
  end
end
-- A ready group of a tenant is in tq, named by its priority, its tenant, then its score,
-- so that a tenant's next group at a priority is the first of its range; tc counts them
-- by priority and tenant.
local function tmember(group, r)
  return r.prio .. gprefix(r.tenant) .. sortable(score(r)) .. group
end
-- listed as ready (unless paused), without waking anyone
local function list_ready(group, r)
  if r.paused == 1 then return end
  if r.tenant == '' then
    redis.call('ZADD', rkey(r.prio), f17(score(r)), group)
  elseif redis.call('ZADD', K.tq, 0, tmember(group, r)) == 1 then
    redis.call('HINCRBY', K.tc, r.prio .. ':' .. r.tenant, 1)
  end
end
-- off the ready sets; its record must be as it was when it was listed
local function unready(group, r)
  if r.tenant == '' then return redis.call('ZREM', rkey(r.prio), group) end
  local gone = redis.call('ZREM', K.tq, tmember(group, r))
  if gone == 1 then
    local field = r.prio .. ':' .. r.tenant
    if redis.call('HINCRBY', K.tc, field, -1) <= 0 then redis.call('HDEL', K.tc, field) end
  end
  return gone
end
local function make_ready(group, r)
  if r.paused == 1 then return end
  list_ready(group, r)
  signal(r.prio)
end
local function earliest()
  local top = redis.call('ZRANGE', K.busy, '0', '0', 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return nil
end
-- a waiting claim sleeps until the earliest deadline: wake it when that moves earlier;
-- `first` is that deadline when the caller knows it already (false: look it up). Returns
-- the end as the scripts reply it, f17.
local function make_busy(group, r, first)
  if first == false then first = earliest() end
  local due = f17(r.due)
  if redis.call('ZADD', K.busy, due, group) == 1 then bump(kind(r), 1) end
  if first == nil or first > r.due then signal(r.prio) end
  return due
end
-- a group whose head changed goes on: held by its head's not-before time, or ready
local function go_on(group, r)
  if r.hold == 1 then make_busy(group, r, false) else make_ready(group, r) end
end
-- off busy, else off the ready sets: a group is in one of them at most (check says so)
local function unlist(group, r)
  if redis.call('ZREM', K.busy, group) == 1 then
    bump(kind(r), -1)
  else
    unready(group, r)
  end
end
-- message `seq` of the group leaves: its not-before time, if it had one, goes too
local function drop_hold(r, seq)
  if r.holds > 0 and redis.call('HDEL', K.td, 'h' .. seq) == 1 then
    redis.call('ZREM', K.hz, hex(seq))
    r.holds = r.holds - 1
  end
end
-- a group that is created: its tenant, and paused if its id is. Its first record ends
-- with PAD (see `GROUP_PAD`), which unpack reads as one more value, ignored.
local function new_group(group, seq, prio, tenant)
  local r = {head = seq, tail = seq, depth = 1, prio = tonumber(prio), att = 0, base = 0,
             worker = '', due = 0, last = 0, held = 0, tenant = tenant, paused = 0, hold = 0,
             holds = 0, pad = PAD}
  if redis.call('SISMEMBER', K.pz, group) == 1 then r.paused = 1 end
  if tenant ~= '' then redis.call('HINCRBY', K.tw, 'n' .. tenant, 1) end
  return r
end
local function forget_group(group, r)
  redis.call('HDEL', K.g, group)
  if r.tenant ~= '' and redis.call('HINCRBY', K.tw, 'n' .. r.tenant, -1) <= 0 then
    redis.call('HDEL', K.tw, 'n' .. r.tenant)
  end
end
-- the head is done: the next message becomes the head, or the group is forgotten
local function advance(group, r)
  local head = r.head
  if r.held ~= 0 then redis.call('ZREM', K.hg, group) end
  not_ready(group, head)
  -- the seq as a field name, formatted once (as an integer: a number passed to
  -- redis.call is formatted with '%.17g', which costs more)
  local field = string.format('%d', head)
  redis.call('HDEL', K.ev, field)
  -- a group's last message links to none
  local nxt = nil
  if r.depth > 1 then
    nxt = redis.call('HGET', K.nx, field)
    redis.call('HDEL', K.nx, field)
  end
  drop_hold(r, head)
  r.depth = r.depth - 1
  if r.depth == 0 or not nxt then
    forget_group(group, r)
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
  -- the head's not-before time, when it has one: the group is then held until it
  r.hold = 0
  if r.holds > 0 then
    local due = redis.call('HGET', K.td, 'h' .. r.head)
    if due then r.hold, r.due = 1, tonumber(due) end
  end
  save(group, r)
  return r
end
-- the fenced head acked: its group goes on with the next message, or is forgotten
local function acked(group, r)
  unlist(group, r)
  bump('m' .. DIGIT[r.prio], -1)
  local n = advance(group, r)
  if n then go_on(group, n) end
end
-- the fenced head nacked: ready again at once (`delay` 0), else parked, its group held,
-- until `delay` after `given` (a time, or the now argument: '' for the server's TIME,
-- read only then)
local function nacked(group, r, delay, given)
  unlist(group, r)
  r.worker = ''
  if delay > 0 then
    r.due = clock(given) + delay
    save(group, r)
    make_busy(group, r, false)
  else
    r.due = 0
    save(group, r)
    make_ready(group, r)
  end
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
  drop_hold(r, r.head)
  redis.call('HSET', K.dead, r.head, cmsgpack.pack(
    group, r.prio, raw, r.att, how, text, r.att - r.base, max, last, now, held))
  redis.call('ZADD', K.deadq, r.head, r.head)
  redis.call('ZADD', K.dg, 0, dead_member(group, r.head))
  bump('m' .. DIGIT[r.prio], -1)
  bump('d' .. DIGIT[r.prio], 1)
  unlist(group, r)
  if held == 1 then
    redis.call('HDEL', K.ev, r.head)
    not_ready(group, r.head)
    redis.call('ZADD', K.hg, 0, group)
    r.held, r.worker, r.due = r.head, '', 0
    save(group, r)
  else
    local n = advance(group, r)
    if n then go_on(group, n) end
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
""".replace("UNPACK_GROUP", UNPACK_GROUP).replace("PAD}", GROUP_PAD + "}")


# Appending, delaying and promoting. A message's stored value names its group and own
# priority (see `owner`): the client builds it, so that storing costs nothing more. A
# delayed message
# without hold waits apart: `td` t<seq> holds (group, prio, raw, tenant, due), `tm` its hex
# seq by due time (ties: by seq, the hex's order), `tg` gprefix(group) .. sortable(due) ..
# hex seq, so that a group's are one range by due. A hold-delayed one is in its chain at
# once, with `td` h<seq> its due time and `hz` its hex seq by priority and due (stats
# counts those).
# Used by the publishes, the claim and the promotion ahead of admin reads.
TIMERS: Final = r"""
-- the due time of the earliest delayed message waiting apart, or nil
local function first_timer()
  local t = redis.call('ZRANGE', K.tm, 0, 0, 'WITHSCORES')
  if t[2] then return tonumber(t[2]) end
  return nil
end
-- message `seq` at the end of its group, the group created if it has none; ready since
-- `since`
local function enqueue(group, prio, raw, tenant, seq, since)
  redis.call('HSET', K.ev, seq, raw)
  local r = load(group)
  if r then
    redis.call('HSET', K.nx, r.tail, seq)
    r.tail, r.depth = seq, r.depth + 1
    save(group, r)
  else
    r = new_group(group, seq, prio, tenant)
    save(group, r)
    make_ready(group, r)
  end
  bump('m' .. DIGIT[r.prio], 1)
  now_ready(group, r.prio, seq, since)
  return r
end
local function append(group, prio, raw, now)
  local seq = redis.call('INCR', K.seq)
  enqueue(group, prio, raw, '', seq, now)
  return seq
end
-- a delayed message that came due (its hex seq) joins the end of its group
local function promote_one(h)
  local seq = tonumber(h, 16)
  local group, prio, raw, tenant, due = cmsgpack.unpack(redis.call('HGET', K.td, 't' .. seq))
  redis.call('HDEL', K.td, 't' .. seq)
  redis.call('ZREM', K.tm, h)
  redis.call('ZREM', K.tg, gprefix(group) .. sortable(due) .. h)
  bump('t' .. prio, -1)
  enqueue(group, prio, raw, tenant, seq, due)
end
-- the delayed messages due at `now`, at most `limit`, by (due, seq); how many
local function promote(now, limit)
  local due = redis.call('ZRANGEBYSCORE', K.tm, '-inf', f17(now), 'LIMIT', 0, limit)
  for _, h in ipairs(due) do promote_one(h) end
  return #due
end
-- before a publish appends to `group`: its own due ones first (`given`: the call's time,
-- or its now argument, when the server's clock is read only if some message waits)
local function promote_group(group, given, limit)
  if redis.call('EXISTS', K.tm) == 0 then return end
  local p = gprefix(group)
  local now = given
  if type(now) ~= 'number' then now = clock(given) end
  local due = redis.call('ZRANGEBYLEX', K.tg, '[' .. p, '[' .. p .. sortable(now) .. TOP,
    'LIMIT', 0, limit)
  for _, member in ipairs(due) do promote_one(string.sub(member, -16)) end
end
"""

# Storing a publish with a delay or hold: ahead of the bodies that do, after `TIMERS`.
# Made by `put_helpers` only when a publish has a delay: Lua makes a closure of every
# function each time a script runs, needed or not.
PUT: Final = (
    r"""
local function put_helpers()
"""
    + textwrap.indent(
        r"""
-- a deadline a waiting claim may sleep past: wake the claims that may take `prio`
local function wake_for(due, prio)
  local first, t = earliest(), first_timer()
  if (first == nil or due < first) and (t == nil or due < t) then signal(prio) end
end
-- a publish with a delay (`due`, after now: callers with no delay enqueue), hold and
-- tenant ('' none), its seq given
local function put(seq, group, prio, raw, tenant, due, hold)
  if due > 0 and hold ~= '1' then
    local h = hex(seq)
    wake_for(due, tonumber(prio))
    redis.call('HSET', K.td, 't' .. seq, cmsgpack.pack(group, tonumber(prio), raw, tenant, due))
    redis.call('ZADD', K.tm, f17(due), h)
    redis.call('ZADD', K.tg, 0, gprefix(group) .. sortable(due) .. h)
    bump('t' .. prio, 1)
    return
  end
  redis.call('HSET', K.ev, seq, raw)
  local r = load(group)
  local fresh = r == nil
  if fresh then
    r = new_group(group, seq, prio, tenant)
  else
    redis.call('HSET', K.nx, r.tail, seq)
    r.tail, r.depth = seq, r.depth + 1
  end
  redis.call('HSET', K.td, 'h' .. seq, f17(due))
  redis.call('ZADD', K.hz, f17(hold_score(r.prio, due)), hex(seq))
  r.holds = r.holds + 1
  bump('m' .. r.prio, 1)
  -- in its chain at once, but ready only once due: its age counts from then
  now_ready(group, r.prio, seq, due)
  if fresh then
    r.hold, r.due = 1, due
    save(group, r)
    make_busy(group, r, false)
  else
    save(group, r)
  end
end
""",
        "  ",
    )
    + r"""
  return {put = put}
end
"""
)

# For the scripts that read a stored message's group and priority.
OWNER: Final = r"""
-- the group and own priority of a stored message (`ev`'s value), or nil when it was
-- stored before they were (JSON never starts with byte 1)
local function owner(v)
  if not v or string.byte(v, 1) ~= 1 then return nil end
  local n = tonumber(string.sub(v, 3, 10), 16)
  return string.sub(v, 11, 10 + n), tonumber(string.sub(v, 2, 2))
end
"""

# A message appended to its group's chain: a new group is ready at once, an existing one
# only gets a longer chain. Used by PUBLISH and PUBLISH_WITH, ahead of their bodies.
APPEND: Final = TIMERS

# A batch's messages appended, their seqs consecutive from `first`: ARGV from `at`, per
# item `stride` arguments of which the first three are group, prio, raw; the items
# `skip` names (a table of 0-based indexes, or nil) are left out and take no seq; each
# group's due delayed messages join it first (`given`: the call's now argument). Used by
# PUBLISH_MANY and PUBLISH_MANY_KEYED, ahead of their bodies.
APPEND_MANY: Final = (
    TIMERS
    + r"""
local function append_many(first, n, at, stride, skip, given)
  local cache, added, seq = {}, {}, first
  local now, ready, scores = clock(given), {}, {}
  for i = 0, n - 1 do
    if not (skip and skip[i]) then
      local base = at + stride * i
      local group = ARGV[base]
      redis.call('HSET', K.ev, seq, ARGV[base + 2])
      local r = cache[group]
      if r == nil then
        promote_group(group, now, PROMOTE)
        r = load(group)
      end
      if r then
        redis.call('HSET', K.nx, r.tail, seq)
        r.tail, r.depth = seq, r.depth + 1
      else
        r = new_group(group, seq, ARGV[base + 1], '')
        r.new = true
      end
      cache[group] = r
      added[r.prio] = (added[r.prio] or 0) + 1
      local score = scores[r.prio]
      if score == nil then
        score = f17(ready_score(r.prio, now))
        scores[r.prio] = score
      end
      ready[#ready + 1], ready[#ready + 2] = score, ready_member(seq, group)
      seq = seq + 1
    end
  end
  for group, r in pairs(cache) do
    save(group, r)
    if r.new then make_ready(group, r) end
  end
  for p, count in pairs(added) do bump('m' .. p, count) end
  -- a thousand arguments a call: Lua's stack holds some 8,000
  for from = 1, #ready, 1000 do
    redis.call('ZADD', K.rt, unpack(ready, from, math.min(from + 999, #ready)))
  end
end
""".replace("PROMOTE", str(PROMOTE))
)

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


_FUNCTION = re.compile(r"local function (\w+)\(")
_NAME = re.compile(r"\w+")


def shaken(code: str) -> str:
    """``code`` without the helper functions it never calls. Lua makes a closure of every
    ``local function`` each time a script runs, and the shared helpers are many: a script
    carries only those its own code reaches. A helper is a ``local function`` at the
    start of a line (with the comment lines just above it) up to its ``end`` at the start
    of a line, or its one line when it ends there."""
    lines = code.split("\n")
    blocks: list[tuple[str | None, list[str]]] = []  # (helper name or None, its lines)
    i = 0
    while i < len(lines):
        match = _FUNCTION.match(lines[i])
        if match is None:
            blocks.append((None, [lines[i]]))
            i += 1
            continue
        notes: list[str] = []
        while blocks and blocks[-1][0] is None and blocks[-1][1][0].startswith("--"):
            notes = blocks.pop()[1] + notes
        end = i
        if not lines[i].rstrip().endswith(" end"):
            while lines[end] != "end":
                end += 1
        blocks.append((match.group(1), notes + lines[i : end + 1]))
        i = end + 1
    helpers = {name: text for name, text in blocks if name is not None}
    wanted: set[str] = set()
    todo = [line for name, text in blocks if name is None for line in text]
    while todo:
        for word in _NAME.findall(todo.pop()):
            if word in helpers and word not in wanted:
                wanted.add(word)
                todo += helpers[word]
    return "\n".join(
        line for name, text in blocks if name is None or name in wanted for line in text
    )


def used_keys(code: str) -> set[str]:
    """The key suffixes ``code`` reads: ``K.<name>``, and the ready and wake-up lists of
    every priority where it builds their names."""
    used = set(re.findall(r"\bK\.(\w+)", code))
    if "K['r' .." in code:
        used.update(READY_KEYS)
    if "K['w' .." in code:
        used.update(WAKE_KEYS)
    return used


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
        code = shaken(HELPERS + self.body)
        keys = tuple(k for k in self.keys if k in used_keys(code))
        object.__setattr__(self, "keys", keys)
        bind = [f"local K = {{{', '.join(f'{k} = KEYS[{i}]' for i, k in enumerate(keys, 1))}}}"]
        bind.append(
            f"local A = {{{', '.join(f'{a} = ARGV[{i}]' for i, a in enumerate(self.args, 1))}}}"
        )
        shebang = f"#!lua flags={self.flags}" if self.flags else "#!lua"
        source = "\n".join([shebang, f"-- durable-transports: {self.name}", *bind, code])
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sha", hashlib.sha1(source.encode()).hexdigest())
        object.__setattr__(self, "writes", "no-writes" not in self.flags)


# A plain publish: its group's due delayed messages join it first.
PUBLISH: Final = Script(
    "publish",
    ("group", "prio", "raw", "now"),
    APPEND
    + r"""
local now = clock(A.now)
promote_group(A.group, now, PROMOTE)
return append(A.group, A.prio, A.raw, now)
""".replace("PROMOTE", str(PROMOTE)),
)

# A publish with a key ('' none), a delay (0 none), hold ('1') or a tenant ('' none). A
# key in use within the window: nothing is stored, and the reply is minus the seq of the
# message first published with it. Otherwise the message is stored (due at now + delay)
# and the key (forgotten or never used) remembered until now + window.
PUBLISH_WITH: Final = Script(
    "publish_with",
    ("group", "prio", "raw", "member", "window", "now", "delay", "hold", "tenant"),
    APPEND
    + PUT
    + KEY_HELPERS
    + r"""
local now = clock(A.now)
if A.member ~= '' then
  forget(now, FORGET)
  local original = lookup(A.member, now)
  if original then return -original end
end
promote_group(A.group, now, PROMOTE)
local seq = redis.call('INCR', K.seq)
local delay = tonumber(A.delay)
if delay > 0 then
  put_helpers().put(seq, A.group, A.prio, A.raw, A.tenant, now + delay, A.hold)
else
  enqueue(A.group, A.prio, A.raw, A.tenant, seq, now)
end
if A.member ~= '' then remember(A.member, seq, now + tonumber(A.window)) end
return seq
""".replace("FORGET", str(FORGET)).replace("PROMOTE", str(PROMOTE)),
    keys=KEYED_KEYS,
)

# ARGV after `count` and `now`: group, prio, raw for each item; seqs are consecutive
# from the reply.
PUBLISH_MANY: Final = Script(
    "publish_many",
    ("count", "now"),
    APPEND_MANY
    + r"""
local n = tonumber(A.count)
local first = redis.call('INCRBY', K.seq, n) - n + 1
append_many(first, n, 3, 3, nil, A.now)
return first
""",
)


def _many_keyed(name: str, stride: int, store: str, helpers: str = "") -> Script:
    """A batch with keys: ARGV after `count`, `window` and `now` is `stride` arguments
    per item, the first four group, prio, raw, key field ('' for no key). An item whose
    key is in use (in the store, or by an earlier item of the batch) is left out; the
    others take consecutive seqs from the reply's first number, which the left-out items
    follow as (index from 0, the original's seq) pairs. ``store`` stores the items that
    are not left out, from `first`, with ``helpers`` ahead of the body."""
    return Script(
        name,
        ("count", "window", "now"),
        APPEND_MANY
        + helpers
        + KEY_HELPERS
        + r"""
local n = tonumber(A.count)
local now = clock(A.now)
local members, items = {}, {}
for i = 0, n - 1 do
  local member = ARGV[7 + STRIDE * i]
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
STORE
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
""".replace("STORE", store)
        .replace("FORGET", str(FORGET))
        .replace("STRIDE", str(stride))
        .replace("PROMOTE", str(PROMOTE)),
        keys=KEYED_KEYS,
    )


# Items of four arguments: group, prio, raw, key field.
PUBLISH_MANY_KEYED: Final = _many_keyed(
    "publish_many_keyed", 4, "append_many(first, n, 4, 4, skip, now)"
)

# Items of seven arguments: group, prio, raw, key field, delay, hold ('1' or '0'),
# tenant ('' none); each stored as PUBLISH_WITH stores one.
PUBLISH_MANY_WITH: Final = _many_keyed(
    "publish_many_with",
    7,
    helpers=PUT,
    store=r"""
local helpers = nil
for i = 0, n - 1 do
  if not skip[i] then
    local at = 4 + 7 * i
    local group, delay, seq = ARGV[at], tonumber(ARGV[at + 4]), first + ord[i]
    promote_group(group, now, PROMOTE)
    if delay > 0 then
      helpers = helpers or put_helpers()
      helpers.put(seq, group, ARGV[at + 1], ARGV[at + 2], ARGV[at + 6], now + delay, ARGV[at + 5])
    else
      enqueue(group, ARGV[at + 1], ARGV[at + 2], ARGV[at + 6], seq, now)
    end
  end
end""",
)

# The tenants' turns (see `TransportAdmin`), for the claim: `tp` holds V and each
# tenant's pass ('p' .. tenant, '' for groups without one) and 'hi', the highest pass of
# a named tenant. While no tenant's group is ready (no `tc`), a claim serves the groups
# without a tenant as before tenants existed, and writes nothing about turns unless `tp`
# exists; once a claim served them while every named tenant's pass is at most V, `tp` is
# dropped: that state is "V, the groups without a tenant at V + 1, everyone else at V",
# which needs no field once a claim ever happened (an l<p> counter exists), and with
# no claim ever, "everyone at 0". So a queue without tenants keeps no turns at all.
TURNS: Final = r"""
local function claimed_ever()
  for _, v in ipairs(redis.call('HMGET', K.n, 'l0', 'l1', 'l2', 'l3', 'l4')) do
    if v then return true end
  end
  return false
end
-- the tenant whose turn it is among those with a ready group at or above `floor`
-- ('' for the groups without one), and its start, max(pass, V); nil when none
local function turn(floor)
  local active, any = {}, false
  for _, f in ipairs(redis.call('HKEYS', K.tc)) do
    if tonumber(string.sub(f, 1, 1)) >= floor then active[string.sub(f, 3)], any = true, true end
  end
  for p = floor, 4 do
    if redis.call('EXISTS', rkey(p)) == 1 then active[''], any = true, true; break end
  end
  if not any then return nil end
  local known = redis.call('EXISTS', K.tp) == 1
  local V, none_pass = 0, nil
  if known then
    V = tonumber(redis.call('HGET', K.tp, 'V') or 0)
  elseif claimed_ever() then
    none_pass = 1
  else
    none_pass = 0
  end
  local chosen, start = nil, nil
  for t in pairs(active) do
    local pass = 0
    if known then
      pass = tonumber(redis.call('HGET', K.tp, 'p' .. t) or 0)
    elseif t == '' then
      pass = none_pass
    end
    local s = math.max(pass, V)
    if chosen == nil or s < start or (s == start and t < chosen) then chosen, start = t, s end
  end
  return chosen, start, none_pass
end
-- `tenant` served from `start`: V moves there, its pass on by 1 / its weight;
-- `none_pass`: the pass of the groups without a tenant when `tp` was absent, kept
local function account(tenant, start, none_pass)
  if none_pass then redis.call('HSET', K.tp, 'p', none_pass) end
  local w = 1
  if tenant ~= '' then w = tonumber(redis.call('HGET', K.tw, 'w' .. tenant) or 1) end
  local pass = start + 1 / w
  redis.call('HSET', K.tp, 'V', f17(start), 'p' .. tenant, f17(pass))
  local hi = tonumber(redis.call('HGET', K.tp, 'hi') or 0)
  if tenant ~= '' then
    if pass > hi then redis.call('HSET', K.tp, 'hi', f17(pass)) end
  elseif hi <= start then
    redis.call('DEL', K.tp)
  end
end
-- the ready group of `tenant` whose turn it is, at or above `floor`
local function tenant_pick(tenant, floor)
  local p0 = gprefix(tenant)
  local best = nil
  for p = floor, 4 do
    local from = p .. p0
    local m = redis.call('ZRANGEBYLEX', K.tq, '[' .. from, '[' .. from .. TOP, 'LIMIT', 0, 1)[1]
    -- past the priority digit, members compare by score, then group
    if m and (best == nil or string.sub(m, 2) < string.sub(best, 2)) then best = m end
  end
  if best == nil then return nil end
  return string.sub(best, 2 + #p0 + 8)
end
"""

# One claim's decisions, written once for every script that claims (CLAIM, CLAIM_MANY,
# ACK_AND_CLAIM): `claim_one(now, c)` promotes delayed messages that came due (at most
# PROMOTE) and frees lapsed leases and ended parks (at most c.sweep; their group keeps
# its holder, so a lapsed lease nobody re-claimed can still be acked), then leases a
# ready group at or above the floor: with tenants, one of the tenant whose turn it is
# (`TURNS`); of those, the one whose last claim is oldest. With max_attempts, a head out
# of deliveries is made a dead letter instead and the claim goes on. ``c`` holds the
# claim's arguments by the names of `CLAIM_ARGS` (the script's own ``A`` where it
# declares them so). Value: {1, seq, group, raw, att, due} or {0, now, earliest
# deadline (of a lease, a park or a delayed message) or ''}. It reads everything it
# decides on afresh, so n calls in one script lease what n scripts would, in order.
# The time between two claims of one batch (see `claiming_many` in core).
TICK: Final = TURN_STEP
CLAIM_ARGS: Final = ("worker", "vis", "floor", "now", "max", "on_dead", "cascade", "sweep")
CLAIMING: Final = (
    r"""
-- The helpers of timers and of tenants, each made only by a claim that needs them: Lua
-- makes a closure of every function each time a script runs, needed or not.
local function timer_helpers()
"""
    + textwrap.indent(TIMERS, "  ")
    + r"""
  return {promote = promote}
end
local function tenant_helpers()
"""
    + textwrap.indent(TURNS, "  ")
    + r"""
  return {turn = turn, account = account, tenant_pick = tenant_pick}
end
local X = nil
-- the delayed messages promoted and the lapsed leases and ended parks freed by the
-- claims of this script so far (a batch stops at `sweep` of them: see CLAIM_MANY)
local moved = 0
local function next_timer()
  local t = redis.call('ZRANGE', K.tm, 0, 0, 'WITHSCORES')
  if t[2] then return tonumber(t[2]) end
  return nil
end
local function claim_one(now, c)
"""
    + textwrap.indent(
        r"""
-- One call tells a queue that never used timers or tenants (nor does now) from others;
-- with delayed messages waiting, a second reads the earliest, and whether tenants are
-- about follows from the first's count.
local extras = redis.call('EXISTS', K.tm, K.tc, K.tp)
local timer, tenants = nil, extras > 0
if extras > 0 then
  timer = next_timer()
  if timer ~= nil then tenants = extras > 1 end
end
if timer ~= nil and timer <= now then
  moved = moved + timer_helpers().promote(now, PROMOTE)
  timer, tenants = next_timer(), true  -- a promoted message may have made a tenant's group
end
local first = earliest()
if first ~= nil and first < now then
  local due = redis.call('ZRANGEBYSCORE', K.busy, '-inf', '(' .. f17(now), 'LIMIT', 0, c.sweep)
  moved = moved + #due
  for _, group in ipairs(due) do
    local r = load(group)
    redis.call('ZREM', K.busy, group)
    if r then
      bump(kind(r), -1)
      if r.worker == '' then r.due, r.hold = 0, 0; save(group, r) end
      list_ready(group, r)
      if r.tenant ~= '' then tenants = true end
    end
  end
  first = earliest()
end
local floor, max = tonumber(c.floor), tonumber(c.max)
while true do
  local best, tenant, start, none_pass, popped = nil, nil, nil, nil, false
  local tenanted = tenants and redis.call('EXISTS', K.tc) == 1
  if tenanted then
    X = X or tenant_helpers()
    tenant, start, none_pass = X.turn(floor)
    if tenant and tenant ~= '' then best = X.tenant_pick(tenant, floor) end
  end
  if not tenanted or tenant == '' then
    -- the ready group without a tenant whose last claim is oldest; EXISTS first: most
    -- queues use one or two priorities, and ZRANGE costs ten times more. One EXISTS
    -- counts the ready sets there are, then one each finds them, up to that count.
    local ready, sets = {}, {}
    for p = floor, 4 do sets[#sets + 1] = rkey(p) end
    local count = redis.call('EXISTS', unpack(sets))
    if count == #sets then
      ready = sets
    elseif count > 0 then
      for _, k in ipairs(sets) do
        if redis.call('EXISTS', k) == 1 then
          ready[#ready + 1] = k
          if #ready == count then break end
        end
      end
    end
    if #ready == 1 then
      -- taken off its ready set at once: it is leased, or made a dead letter, below
      best, popped = redis.call('ZPOPMIN', ready[1])[1], true
    elseif #ready > 1 then
      local best_score = nil
      for _, k in ipairs(ready) do
        local top = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
        if best == nil or tonumber(top[2]) < best_score then
          best, best_score = top[1], tonumber(top[2])
        end
      end
    end
  end
  if best == nil then
    local next_due = first
    if timer ~= nil and (next_due == nil or timer < next_due) then next_due = timer end
    if next_due == nil then next_due = '' else next_due = f17(next_due) end
    return {0, f17(now), next_due}
  end
  local r = load(best)
  if max > 0 and r.att - r.base >= max then
    local last = 'nacked'
    if r.worker ~= '' then last = 'lapsed' end
    kill(best, r, now, 'x', '', last, max, c.on_dead)
  else
    if not popped then unready(best, r) end
    r.att, r.worker, r.due, r.last = r.att + 1, c.worker, now + tonumber(c.vis), now
    save(best, r)
    local due = make_busy(best, r, first)
    if tenanted then
      X.account(tenant, start, none_pass)
    elseif tenants and redis.call('EXISTS', K.tp) == 1 then
      X = X or tenant_helpers()
      local kept = redis.call('HMGET', K.tp, 'p', 'V')
      X.account('', math.max(tonumber(kept[1] or 0), tonumber(kept[2] or 0)))
    end
    if c.cascade == '1' then
      -- the highest priority with a ready group: of those without a tenant, and of
      -- a tenant's (the last member of tq, by its priority digit)
      local top = redis.call('ZRANGE', K.tq, -1, -1)[1]
      if top then top = tonumber(string.sub(top, 1, 1)) else top = -1 end
      for p = 4, 0, -1 do
        if p <= top or redis.call('EXISTS', rkey(p)) == 1 then signal(p); break end
      end
    end
    return {1, r.head, best, redis.call('HGET', K.ev, r.head), r.att, due}
  end
end
""",
        "  ",
    )
    + "end\n"
).replace("PROMOTE", str(PROMOTE))

# One claim (see `CLAIMING`).
CLAIM: Final = Script(
    "claim",
    CLAIM_ARGS,
    CLAIMING + "return claim_one(clock(A.now), A)\n",
    flags="allow-oom",
)

# Up to `limit` claims, stopping at the first that leases nothing: what `limit` CLAIM
# scripts would lease, in their order (the caller keeps `limit` small enough that the
# server is not stopped for long: `_ops.BATCH`). Each claim is made a `TICK` after the
# one before, as successive claims would be: a group's last claim orders the
# round-robin, which would otherwise take the groups of one batch by name. Each claim
# may free up to `sweep` lapsed leases and promote up to PROMOTE delayed messages: once
# the claims made have moved `sweep` of those, the script stops, so that a crowd of
# them does not make it long, and says so. The batch ends before a claim at or past
# `ends`, the end of its first lease (given by the caller when it goes on, else the
# script's own first): with a visibility of a few microseconds, that claim would see the
# batch's leases lapsed and lease one of their groups again (see `claiming_many` in
# core). Reply: 1 when it stopped after moving many (the caller goes on in another
# script), else 0; then seq, group, raw, att, due of each lease.
CLAIM_MANY: Final = Script(
    "claim_many",
    (*CLAIM_ARGS, "limit", "ends"),
    CLAIMING
    + r"""
moved = 0  -- (in a library, the last call's count stays: see `LIBRARY`)
local now, out, limit = clock(A.now), {0}, tonumber(A.limit)
local ends = tonumber(A.ends)
for i = 1, limit do
  local at = now + (i - 1) * TICK
  if ends and at >= ends then break end
  local got = claim_one(at, A)
  if got[1] == 0 then break end
  ends = ends or tonumber(got[6])
  for j = 2, 6 do out[#out + 1] = got[j] end
  if moved >= tonumber(A.sweep) and i < limit then out[1] = 1; break end
end
return out
""".replace("TICK", repr(TICK)),
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


ACK: Final = on_lease("ack", (), "\nacked(A.group, r)\nreturn 1\n")

# delay 0: ready again at once; else parked, its group held, until now + delay.
NACK: Final = on_lease(
    "nack", ("delay", "now"), "\nnacked(A.group, r, tonumber(A.delay), A.now)\nreturn 1\n"
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

# Acks, nacks and buries, each fenced on its own and done in order, as that many ACK,
# NACK and BURY scripts would (a lease named twice is stale the second time). ARGV after
# `count` and `now`: seven arguments an item, what ('ack', 'nack' or 'bury'), the
# lease's `FENCE`, then a nack's delay, or a bury's reason and on_dead ('' otherwise).
# The caller keeps `count` small enough that the server is not stopped for long
# (`_ops.BATCH`). Reply: the indexes (from 0) of the items whose lease was not current,
# which changed nothing.
SETTLE_MANY: Final = Script(
    "settle_many",
    ("count", "now"),
    r"""
local now, stale = A.now, {}
for i = 0, tonumber(A.count) - 1 do
  local at = 3 + 7 * i
  local group = ARGV[at + 1]
  local r = fenced(group, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4])
  if r == nil then
    stale[#stale + 1] = i
  elseif ARGV[at] == 'ack' then
    acked(group, r)
  else
    -- one time for the whole batch, read at its first nack or bury
    if type(now) ~= 'number' then now = clock(now) end
    if ARGV[at] == 'nack' then
      nacked(group, r, tonumber(ARGV[at + 5]), now)
    else
      kill(group, r, now, 'b', ARGV[at + 5], '', 0, ARGV[at + 6])
    end
  end
end
return stale
""",
    flags="allow-oom",
)

# An ack, then a claim (see `CLAIMING`): the lease's `FENCE` (its worker as `holder`,
# the claim's own is `worker`), then the claim's arguments. Reply: 0 when the lease was
# not current (nothing done, nothing claimed), else the claim's.
ACK_AND_CLAIM: Final = Script(
    "ack_and_claim",
    ("group", "seq", "holder", "att", *CLAIM_ARGS),
    CLAIMING
    + r"""
local r = fenced(A.group, A.seq, A.holder, A.att)
if r == nil then return 0 end
acked(A.group, r)
return claim_one(clock(A.now), A)
""",
    flags="allow-oom",
)

# --- admin -----------------------------------------------------------------------------
# Reads write nothing. Each costs at most `chunk` items a script: an answer that needs
# more is read in several scripts, each its own consistent snapshot (see docs/redis.md).

# The counters, less what a walk finds, `chunk` items a script in all: each call goes on
# from where the last stopped (`phase` and its cursor `after`, with `score`, the cursor's
# score, for when it has left meanwhile; '' to begin). The walks, in order, each served
# by an index whose items it reads are only busy ones, never the whole queue:
#   b   `busy` from its lowest score up to now: the lapsed leases, ended parks and due
#       hold-delayed heads that no claim has freed yet (ready again), by kind; those of
#       paused groups apart (still busy). Bounded by the groups that ended meanwhile.
#   p   `pz` (SSCAN, `after` its cursor): the paused groups outside `busy` that have
#       messages (busy groups that no counter counts). Bounded by the paused groups.
#   h   `hg` by name: the held groups, not paused, with messages behind their dead
#       letter (busy too). Bounded by the held groups.
#   a<p> `rt` in priority p's band from its oldest up to now: the first member that is
#       not an in-flight or parked head is the oldest ready message. The walk passes
#       only heads of busy groups, so it is bounded by those, not by the backlog.
# Reply: now, phase ('' when done), after, score; what this call found: lapsed l0..l4,
# k0..k4, h0..h4, paused among them by priority (5), held busy groups by priority (5),
# the ready-since time of each priority whose oldest ready message it found ('' else);
# on the first call only, the counters m, l, k, d, t, h (each 0..4), the keys
# remembered (those whose time is not up), the hold-delayed messages not due by
# priority, the paused groups, the ready groups of each priority without a tenant
# (ZCARD r<p>) and with one (`tc`); then, as group, priority pairs, the paused groups
# the p walk counted (a set scan may show one twice: the caller counts them once).
STATS: Final = Script(
    "stats",
    ("now", "phase", "after", "score", "chunk"),
    r"""
local now = clock(A.now)
local budget = tonumber(A.chunk)
local phase, after, score = A.phase, A.after, A.score
if phase == '' then phase = 'b' end
local lapsed, paused_lapsed, held_busy, since, paused = {}, {}, {}, {}, {}
local function add(t, k) t[k] = (t[k] or 0) + 1 end
-- the rank after the cursor in sorted set `key`, or `start` to begin the walk
local function resume(key, start)
  if after == '' then return start end
  local at = redis.call('ZRANK', key, after)
  if at then return at + 1 end
  return redis.call('ZCOUNT', key, '-inf', score)
end
while budget > 0 and phase ~= '' do
  if phase == 'b' then
    local from = resume(K.busy, 0)
    local items = redis.call('ZRANGE', K.busy, from, from + budget - 1, 'WITHSCORES')
    local done = #items < 2 * budget
    for i = 1, #items, 2 do
      if tonumber(items[i + 1]) >= now then done = true; break end
      local r = load(items[i])
      if r then
        add(lapsed, kind(r))
        if r.paused == 1 then add(paused_lapsed, r.prio) end
      end
      after, score, budget = items[i], items[i + 1], budget - 1
    end
    if done then phase, after, score = 'p', '0', '' end
  elseif phase == 'p' then
    local scan = redis.call('SSCAN', K.pz, after, 'COUNT', budget)
    after, budget = scan[1], budget - 1
    for _, group in ipairs(scan[2]) do
      budget = budget - 1
      local r = load(group)
      if r and not redis.call('ZSCORE', K.busy, group) then
        local depth = r.depth
        if r.held ~= 0 then depth = depth - 1 end
        if depth > 0 then paused[#paused + 1], paused[#paused + 2] = group, r.prio end
      end
    end
    if after == '0' then phase, after = 'h', '' end
  elseif phase == 'h' then
    local from = '-'
    if after ~= '' then from = '(' .. after end
    local groups = redis.call('ZRANGEBYLEX', K.hg, from, '+', 'LIMIT', 0, budget)
    local done = #groups < budget
    for _, group in ipairs(groups) do
      local r = load(group)
      if r and r.held ~= 0 and r.paused == 0 and r.depth > 1 then add(held_busy, r.prio) end
      after, budget = group, budget - 1
    end
    if done then phase, after, score = 'a0', '', '' end
  else
    local p = tonumber(string.sub(phase, 2))
    local top = ready_score(p, now)
    local start = redis.call('ZCOUNT', K.rt, '-inf', '(' .. f17(ready_score(p, -BAND / 2)))
    local from = resume(K.rt, start)
    local items = redis.call('ZRANGE', K.rt, from, from + budget - 1, 'WITHSCORES')
    local done = #items < 2 * budget
    for i = 1, #items, 2 do
      local s = tonumber(items[i + 1])
      if s > top then done = true; break end
      after, score, budget = items[i], items[i + 1], budget - 1
      local seq, r = tonumber(string.sub(items[i], 1, 16), 16), load(string.sub(items[i], 17))
      -- a head in flight or parked is the only queued message that is not ready (and
      -- one gone is skipped: only a handle of an older version leaves one behind)
      if not (r and r.head == seq and r.held == 0 and r.hold == 0 and r.due > 0
              and r.due >= now) and redis.call('HEXISTS', K.ev, seq) == 1 then
        since[p] = f17(s - p * BAND)
        done = true
        break
      end
    end
    if done then
      after, score = '', ''
      if p < 4 then phase = 'a' .. (p + 1) else phase = '' end
    end
  end
end
local out = {f17(now), phase, after, score}
for _, k in ipairs({'l', 'k', 'h'}) do
  for p = 0, 4 do out[#out + 1] = lapsed[k .. p] or 0 end
end
for p = 0, 4 do out[#out + 1] = paused_lapsed[p] or 0 end
for p = 0, 4 do out[#out + 1] = held_busy[p] or 0 end
for p = 0, 4 do out[#out + 1] = since[p] or '' end
if A.phase == '' then
  local fields = {}
  for _, k in ipairs({'m', 'l', 'k', 'd', 't', 'h'}) do
    for p = 0, 4 do fields[#fields + 1] = k .. p end
  end
  for _, v in ipairs(redis.call('HMGET', K.n, unpack(fields))) do out[#out + 1] = v or 0 end
  out[#out + 1] = redis.call('ZCOUNT', K.kx, '(' .. f17(now), '+inf')
  -- hold-delayed messages not due yet: queued in their chains, counted as delayed
  for p = 0, 4 do
    out[#out + 1] = redis.call('ZCOUNT', K.hz, '(' .. f17(hold_score(p, now)),
      f17(hold_score(p, BAND / 2)))
  end
  out[#out + 1] = redis.call('SCARD', K.pz)
  for p = 0, 4 do out[#out + 1] = redis.call('ZCARD', rkey(p)) end
  local tenanted = {}
  local tc = redis.call('HGETALL', K.tc)
  for i = 1, #tc, 2 do
    local p = tonumber(string.sub(tc[i], 1, 1))
    tenanted[p] = (tenanted[p] or 0) + tonumber(tc[i + 1])
  end
  for p = 0, 4 do out[#out + 1] = tenanted[p] or 0 end
end
for _, v in ipairs(paused) do out[#out + 1] = v end
return out
""",
    flags="no-writes",
    keys=KEYED_KEYS,
)

# The stored format's version of the queue: 0 for one stored before `VERSION`s existed.
STORED_VERSION: Final = Script(
    "stored_version",
    (),
    "return tonumber(redis.call('HGET', K.n, 'v') or 0)",
    flags="no-writes",
)

# A queue stored before `VERSION` 2, brought to it: every queued message put in `rt`,
# ready since `now` (the upgrade's time: when it became ready before is not stored), a
# hold-delayed one since its due time if that is later; every held group in `hg`. A
# walk of the group hash (HSCAN from `cursor`, '' to begin, 'end' when the scan is over)
# and of each group's chain, `chunk` items a call: ARGV after the four named are the
# groups of the scan's last page not yet done, the first from seq `resume` ('' its
# head). ZADD NX and ZADD of a set member, so that what handles of this version
# indexed meanwhile stays, and two upgrades at once do no harm. Reply: 1 when done
# (field v of `n` set), else 0; the time it used; cursor, resume and the groups left,
# for the next call.
UPGRADE: Final = Script(
    "upgrade",
    ("now", "chunk", "cursor", "resume"),
    r"""
local now = clock(A.now)
local budget = tonumber(A.chunk)
local cursor, resume = A.cursor, A.resume
local pending, i = {}, 1
for j = 5, #ARGV do pending[#pending + 1] = ARGV[j] end
while budget > 0 do
  if i > #pending then
    if cursor == 'end' then break end
    if cursor == '' then cursor = '0' end
    local scan = redis.call('HSCAN', K.g, cursor, 'COUNT', budget)
    cursor, pending, i, budget = scan[1], {}, 1, budget - 1
    if cursor == '0' then cursor = 'end' end
    for j = 1, #scan[2], 2 do pending[#pending + 1] = scan[2][j] end
  else
    local group = pending[i]
    local r = load(group)
    local seq = nil
    if r then
      if r.held ~= 0 then redis.call('ZADD', K.hg, 0, group) end
      seq = r.head
      -- the group's walk goes on where it stopped, unless that message left meanwhile
      if resume ~= '' and redis.call('HEXISTS', K.ev, resume) == 1 then seq = tonumber(resume) end
    end
    resume = ''
    while seq do
      if not (seq == r.head and r.held ~= 0) then
        local t = now
        if r.holds > 0 then
          local due = tonumber(redis.call('HGET', K.td, 'h' .. seq) or 0)
          if due > t then t = due end
        end
        redis.call('ZADD', K.rt, 'NX', f17(ready_score(r.prio, t)), ready_member(seq, group))
      end
      budget = budget - 1
      if seq == r.tail then seq = nil else seq = tonumber(redis.call('HGET', K.nx, seq)) end
      if seq and budget <= 0 then resume = tostring(seq); break end
    end
    if resume == '' then i = i + 1 end
  end
end
if i > #pending and cursor == 'end' then
  redis.call('HSET', K.n, 'v', VERSION)
  return {1, f17(now)}
end
local out = {0, f17(now), cursor, resume}
for j = i, #pending do out[#out + 1] = pending[j] end
return out
""".replace("VERSION", str(VERSION)),
)

# Groups from the hash scan's cursor, `chunk` at a time. Reply: now, the next cursor ('0'
# when done), then for this chunk's `limit` deepest groups (ties: oldest head first):
# group, prio, depth, head, state, busy_until or '', last claim or '', paused (1 or 0),
# tenant ('' none). A head held by its not-before time shows as parked until then.
GROUPS: Final = Script(
    "groups",
    ("limit", "now", "cursor", "chunk"),
    r"""
local now = clock(A.now)
local scan = redis.call('HSCAN', K.g, A.cursor, 'COUNT', A.chunk)
local all = scan[2]
local rows = {}
for i = 1, #all, 2 do
  local packed = all[i + 1]
  UNPACK_GROUP
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
  for _, v in ipairs({r.group, r.prio, r.depth, r.head, r.state, r.until_, last, r.paused,
                      r.tenant}) do
    out[#out + 1] = v
  end
end
return out
""".replace("UNPACK_GROUP", UNPACK_GROUP),
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

# Back at its place in its group's chain (by seq), with a fresh allowance of deliveries,
# ready since `now`. Reply: {1} done, {0} no such dead letter, {-1, worker, group} a
# lease holds the group, {-2, seq, group} another dead letter holds it.
REQUEUE: Final = Script(
    "requeue",
    ("seq", "now"),
    r"""
local function is_ready(group, r)
  if r.tenant == '' then return redis.call('ZSCORE', rkey(r.prio), group) ~= false end
  return redis.call('ZSCORE', K.tq, tmember(group, r)) ~= false
end
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
  redis.call('ZREM', K.hg, group)
  r.held, r.base = 0, r.att
  save(group, r)
  make_ready(group, r)
else
  redis.call('HSET', K.ev, seq, raw)
  if r == nil then
    r = new_group(group, seq, prio, '')
    r.att, r.base = att, att
    save(group, r)
    make_ready(group, r)
  else
    local was_ready = is_ready(group, r)
    if was_ready then unready(group, r) end
    if seq < r.head then
      if r.hold == 1 then
        -- the head it goes ahead of holds the group no more (until it is the head again)
        unlist(group, r)
        r.hold, r.due, was_ready = 0, 0, true
      end
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
now_ready(group, r.prio, seq, clock(A.now))
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
    if n then go_on(group, n) end
  end
end
return 1
""",
    flags="allow-oom",
)

# At most `chunk` of the group's messages from its head, and of its dead letters, up to
# seq `upto` ('' to begin: the last seq handed out, so what is published meanwhile
# stays), then of its delayed messages waiting apart (all of them); a leased head goes
# too (its holder gets LeaseLost), and what is left of the
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
  if r then go_on(A.group, r) end
  removed = messages
end
local prefix = gprefix(A.group)
local dead = {}
if budget > 0 then
  dead = redis.call('ZRANGEBYLEX', K.dg, '[' .. prefix, '[' .. prefix .. hex(upto),
    'LIMIT', 0, budget)
end
for _, member in ipairs(dead) do
  unbury(tonumber(string.sub(member, -16), 16))
  removed = removed + 1
end
budget = budget - #dead
local timers = {}
if budget > 0 then
  timers = redis.call('ZRANGEBYLEX', K.tg, '[' .. prefix, '[' .. prefix .. TOP, 'LIMIT', 0, budget)
end
for _, member in ipairs(timers) do
  local h = string.sub(member, -16)
  local seq = tonumber(h, 16)
  local _, p = cmsgpack.unpack(redis.call('HGET', K.td, 't' .. seq))
  redis.call('HDEL', K.td, 't' .. seq)
  redis.call('ZREM', K.tm, h)
  redis.call('ZREM', K.tg, member)
  bump('t' .. p, -1)
  removed = removed + 1
end
local more = 0  -- messages left, or the budget spent before the dead letters' end
if (r and r.head <= upto) or budget <= 0 or #timers == budget then more = 1 end
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
    OWNER
    + r"""
local bad = {}
local function fail(msg) bad[#bad + 1] = msg end
local all = redis.call('HGETALL', K.g)
local chained, events, links, want, tenanted = {}, 0, 0, {}, {}
local indexed, held_groups = 0, 0
local function count(field) want[field] = (want[field] or 0) + 1 end
for i = 1, #all, 2 do
  local group = all[i]
  local r = load(group)
  want['m' .. r.prio] = (want['m' .. r.prio] or 0) + r.depth
  if r.held ~= 0 then want['m' .. r.prio] = want['m' .. r.prio] - 1 end
  if redis.call('ZSCORE', K.busy, group) then count(kind(r)) end
  if r.held ~= 0 then
    held_groups = held_groups + 1
    if not redis.call('ZSCORE', K.hg, group) then fail(group .. ': held but not in hg') end
  end
  local seq, steps = r.head, 1
  while true do
    chained[seq] = true
    if not (seq == r.head and r.held ~= 0) then
      indexed = indexed + 1
      local since = tonumber(redis.call('ZSCORE', K.rt, ready_member(seq, group)))
      if not since then
        fail(group .. ': ' .. seq .. ' not in rt')
      elseif math.abs(since - ready_score(r.prio, 0)) > BAND / 2 then
        fail(group .. ': ' .. seq .. ' in rt outside its priority')
      end
    end
    local v = redis.call('HGET', K.ev, seq)
    if v then
      events = events + 1
      if v and string.byte(v, 1) == 1 and owner(v) ~= group then
        fail(group .. ': ' .. seq .. ' is stored as of another group')
      end
    elseif not (seq == r.head and r.held ~= 0) then fail(group .. ': no event for ' .. seq) end
    if seq == r.tail then break end
    local nxt = redis.call('HGET', K.nx, seq)
    -- Not increasing: a delayed message that came due joins the tail whatever its seq.
    if not nxt or chained[tonumber(nxt)] then fail(group .. ': chain breaks at ' .. seq); break end
    links, seq, steps = links + 1, tonumber(nxt), steps + 1
  end
  if steps ~= r.depth then fail(group .. ': depth ' .. r.depth .. ' but chain ' .. steps) end
  local places = 0
  for p = 0, 4 do
    if redis.call('ZSCORE', rkey(p), group) then
      places = places + 1
      if p ~= r.prio or r.tenant ~= '' then fail(group .. ': ready at priority ' .. p) end
    end
  end
  if r.tenant ~= '' then
    if redis.call('ZSCORE', K.tq, tmember(group, r)) then places = places + 1 end
    tenanted[r.tenant] = (tenanted[r.tenant] or 0) + 1
  end
  local busy = redis.call('ZSCORE', K.busy, group)
  if busy then places = places + 1 end
  if r.held ~= 0 and places ~= 0 then fail(group .. ': held but listed') end
  if r.paused == 1 and places > 0 and not busy then fail(group .. ': paused but ready') end
  if r.paused ~= redis.call('SISMEMBER', K.pz, group) then fail(group .. ': paused flag') end
  if r.held == 0 and r.paused == 0 and places ~= 1 then
    fail(group .. ': in ' .. places .. ' sets')
  end
  if busy and places > 1 then fail(group .. ': busy and ready') end
  if r.hold == 1 and (r.worker ~= '' or r.due == 0) then fail(group .. ': hold but not parked') end
  local holds, s2 = 0, r.head
  for _ = 1, r.depth do
    if redis.call('HEXISTS', K.td, 'h' .. s2) == 1 then holds = holds + 1 end
    if s2 == r.tail then break end
    local nxt = redis.call('HGET', K.nx, s2)
    if not nxt then break end
    s2 = tonumber(nxt)
  end
  if holds ~= r.holds then fail(group .. ': ' .. holds .. ' holds, the record says ' .. r.holds) end
  if r.held == 0 and r.worker == '' and r.due > 0 and not redis.call('ZSCORE', K.busy, group) then
    fail(group .. ': parked but not busy')
  end
end
if redis.call('HLEN', K.ev) ~= events then fail('events outside any chain') end
if redis.call('ZCARD', K.rt) ~= indexed then fail('rt holds messages outside any chain') end
if redis.call('ZCARD', K.hg) ~= held_groups then fail('hg holds groups not held') end
local timers, holds = 0, 0
local td = redis.call('HGETALL', K.td)
for i = 1, #td, 2 do
  local seq = tonumber(string.sub(td[i], 2))
  if string.sub(td[i], 1, 1) == 't' then
    timers = timers + 1
    local group, prio, _, _, due = cmsgpack.unpack(td[i + 1])
    count('t' .. prio)
    if not redis.call('ZSCORE', K.tg, gprefix(group) .. sortable(due) .. hex(seq)) then
      fail('delayed ' .. seq .. ' not indexed by its group')
    end
    if tonumber(redis.call('ZSCORE', K.tm, hex(seq))) ~= due then
      fail('delayed ' .. seq .. ' not indexed by its due time')
    end
  else
    holds = holds + 1
    if not chained[seq] then fail('hold ' .. seq .. ' outside any chain') end
  end
end
if redis.call('ZCARD', K.tm) ~= timers or redis.call('ZCARD', K.tg) ~= timers then
  fail('delayed messages and their indexes')
end
if redis.call('ZCARD', K.hz) ~= holds then fail('hold-delayed messages and their index') end
local ready_tenanted = redis.call('ZCARD', K.tq)
local tc = 0
for _, v in ipairs(redis.call('HVALS', K.tc)) do tc = tc + tonumber(v) end
if tc ~= ready_tenanted then
  fail('tenants ready: ' .. tc .. ' counted, ' .. ready_tenanted .. ' listed')
end
local tw = redis.call('HGETALL', K.tw)
for i = 1, #tw, 2 do
  local name = string.sub(tw[i], 2)
  if string.sub(tw[i], 1, 1) == 'n' then
    if tonumber(tw[i + 1]) ~= (tenanted[name] or 0) then fail('groups of tenant ' .. name) end
    tenanted[name] = nil
  end
end
if next(tenanted) ~= nil then fail('tenant groups not counted') end
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
for _, k in ipairs({'m', 'l', 'k', 'd', 'h', 't'}) do
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

# --- timers, group control, tenants ------------------------------------------------

# The delayed messages due at `now`, at most `chunk`, join their groups: what the admin
# calls run first, so that they see what a claim would. Reply: now, how many it moved.
PROMOTE_DUE: Final = Script(
    "promote_due",
    ("now", "chunk"),
    TIMERS
    + r"""
local now = clock(A.now)
return {f17(now), promote(now, tonumber(A.chunk))}
""",
    flags="allow-oom",
)

# Message `seq` removed unless a worker holds it (leased, its lease not lapsed): a
# delayed one waiting apart, or one in its group's chain (its group read from its stored
# value, see `owner`; the chain is walked up to it). A head removed lets its group go
# on. Reply: 1 or 0.
CANCEL: Final = Script(
    "cancel",
    ("seq", "now"),
    OWNER
    + r"""
local seq = tonumber(A.seq)
local t = redis.call('HGET', K.td, 't' .. seq)
if t then
  local group, prio, _, _, due = cmsgpack.unpack(t)
  redis.call('HDEL', K.td, 't' .. seq)
  redis.call('ZREM', K.tm, hex(seq))
  redis.call('ZREM', K.tg, gprefix(group) .. sortable(due) .. hex(seq))
  bump('t' .. prio, -1)
  return 1
end
local group = owner(redis.call('HGET', K.ev, seq))
if not group then return 0 end
local r = load(group)
if r == nil then return 0 end
if r.head == seq then
  if r.held ~= 0 or (r.worker ~= '' and r.due >= clock(A.now)) then return 0 end
  unlist(group, r)
  bump('m' .. DIGIT[r.prio], -1)
  local n = advance(group, r)
  if n then go_on(group, n) end
  return 1
end
-- The whole chain, if need be: a delayed message that came due joined its tail, so seqs
-- along a chain need not increase.
local prev, found = r.head, false
for _ = 2, r.depth do
  local nxt = tonumber(redis.call('HGET', K.nx, prev))
  if nxt == nil then return 0 end
  if nxt == seq then found = true; break end
  prev = nxt
end
if not found then return 0 end
local after = redis.call('HGET', K.nx, seq)
if after then
  redis.call('HSET', K.nx, prev, after)
else
  redis.call('HDEL', K.nx, prev)
  r.tail = prev
end
redis.call('HDEL', K.ev, seq)
redis.call('HDEL', K.nx, seq)
redis.call('HDEL', K.att, seq)
not_ready(group, seq)
drop_hold(r, seq)
r.depth = r.depth - 1
save(group, r)
bump('m' .. r.prio, -1)
return 1
""",
    flags="allow-oom",
)

# Pause (`paused` '1') or resume a group: the pause is a member of `pz`, kept whether the
# group has messages or not; the group's record carries it too, so that a paused group is
# never listed as ready and a claim never looks at it. Reply: 1 if it changed anything.
PAUSE: Final = Script(
    "pause",
    ("group", "paused"),
    r"""
local r = load(A.group)
if A.paused == '1' then
  if redis.call('SADD', K.pz, A.group) == 0 then return 0 end
  if r then
    unready(A.group, r)
    r.paused = 1
    save(A.group, r)
  end
  return 1
end
if redis.call('SREM', K.pz, A.group) == 0 then return 0 end
if r then
  r.paused = 0
  save(A.group, r)
  if r.held == 0 and not redis.call('ZSCORE', K.busy, A.group) then make_ready(A.group, r) end
end
return 1
""",
    flags="allow-oom",
)

PAUSED_GROUPS: Final = Script(
    "paused_groups",
    (),
    "return redis.call('SMEMBERS', K.pz)",
    flags="no-writes",
)

# At most `limit` messages of a group in delivery order: its chain from the head (a
# dead letter holding it left out), then its delayed messages waiting apart, by due.
# Reply per message: seq, priority, raw, attempts, state, due_at ('' none).
PEEK: Final = Script(
    "peek",
    ("group", "limit", "now"),
    OWNER
    + r"""
local now = clock(A.now)
-- Lua's numbers are doubles: a huge limit would reach LIMIT as 9.2e+18, which Redis
-- refuses; no group holds 2^31 messages.
local limit = math.min(tonumber(A.limit), 2^31)
local out, shown = {}, 0
local r = load(A.group)
if r then
  local seq = r.head
  if r.held ~= 0 then seq = tonumber(redis.call('HGET', K.nx, seq)) end
  while seq and shown < limit do
    local v = redis.call('HGET', K.ev, seq)
    local _, prio = owner(v)
    prio = prio or r.prio
    local att, state, due = 0, 'queued', ''
    if seq == r.head then
      att = r.att
    else
      local stash = redis.call('HGET', K.att, seq)
      if stash then att = cmsgpack.unpack(stash) end
    end
    local hold = false
    if r.holds > 0 then hold = redis.call('HGET', K.td, 'h' .. seq) end
    if hold and tonumber(hold) > now then
      state, due = 'delayed', hold
    elseif shown == 0 and r.held == 0 then  -- behind a held dead letter: queued
      state = 'ready'
      if seq == r.head and r.due >= now and r.due > 0 then
        due = f17(r.due)
        if r.worker ~= '' then state = 'in_flight' else state = 'parked' end
      end
    end
    for _, x in ipairs({seq, prio, v, att, state, due}) do out[#out + 1] = x end
    shown = shown + 1
    if seq == r.tail then break end
    seq = tonumber(redis.call('HGET', K.nx, seq))
  end
end
if shown < limit then
  local p = gprefix(A.group)
  local later = redis.call('ZRANGEBYLEX', K.tg, '[' .. p, '[' .. p .. TOP, 'LIMIT', 0,
    limit - shown)
  for _, member in ipairs(later) do
    local seq = tonumber(string.sub(member, -16), 16)
    local _, prio, raw, _, due = cmsgpack.unpack(redis.call('HGET', K.td, 't' .. seq))
    for _, v in ipairs({seq, prio, raw, 0, 'delayed', f17(due)}) do out[#out + 1] = v end
  end
end
return out
""",
    flags="no-writes",
)

SET_TENANT_WEIGHT: Final = Script(
    "set_tenant_weight",
    ("tenant", "weight"),
    "redis.call('HSET', K.tw, 'w' .. A.tenant, A.weight)\nreturn 1",
)

# Reply: the groups without a tenant, then per named tenant with groups or a weight:
# name, weight ('' for 1, unset), groups.
TENANTS: Final = Script(
    "tenants",
    (),
    r"""
local counts, named, weights = {}, 0, {}
local tw = redis.call('HGETALL', K.tw)
for i = 1, #tw, 2 do
  local name = string.sub(tw[i], 2)
  if string.sub(tw[i], 1, 1) == 'n' then
    counts[name] = tonumber(tw[i + 1])
    named = named + tonumber(tw[i + 1])
  else
    weights[name] = tw[i + 1]
    counts[name] = counts[name] or 0
  end
end
local out = {redis.call('HLEN', K.g) - named}
for name, n in pairs(counts) do
  if n > 0 or weights[name] then
    out[#out + 1], out[#out + 2], out[#out + 3] = name, weights[name] or '', n
  end
end
return out
""",
    flags="no-writes",
)

# The benchmark's floor: a script that reads nothing and writes nothing.
NOTHING: Final = Script("nothing", (), "return 1", keys=())

ALL: Final = (
    PUBLISH, PUBLISH_WITH, PUBLISH_MANY, PUBLISH_MANY_KEYED, PUBLISH_MANY_WITH, CLAIM, ACK,
    NACK, UNCLAIM, EXTEND, BURY, CLAIM_MANY, SETTLE_MANY, ACK_AND_CLAIM, STATS, GROUPS,
    DEAD_LETTERS, REQUEUE, DISCARD, PURGE_GROUP, CHECK, PROMOTE_DUE, CANCEL, PAUSE,
    PAUSED_GROUPS, PEEK, SET_TENANT_WEIGHT, TENANTS, STORED_VERSION, UPGRADE,
)  # fmt: skip


@dataclass(frozen=True)
class Library:
    """Every script as one Redis Functions library (Redis 7), which the runners call with
    FCALL: the shared helpers are made once, when the server loads the library, where a
    script makes a closure of each helper it carries at every call. Its name and its
    functions' carry its digest, since a server may hold the libraries of several
    versions of this code at once."""

    source: str
    name: str

    def function(self, script: Script) -> str:
        return f"{self.name}_{script.name}"


# The texts that scripts start with, which a library holds once, ahead of its functions
# (in this order: each uses helpers of those before it). APPEND_MANY starts with TIMERS.
_SHARED: Final = (APPEND_MANY, PUT, OWNER, KEY_HELPERS, CLAIMING)


def _own(body: str) -> str:
    """A script's body less the shared texts it starts with."""
    shared = (*_SHARED, TIMERS)
    while True:
        for text in shared:
            if body.startswith(text):
                body = body[len(text) :]
                break
        else:
            return body


# How many queues' key tables a function keeps (see `library`): past that many it
# forgets them all, so that a server of many queues does not keep a table for each.
KNOWN: Final = 64


def library(scripts: tuple[Script, ...]) -> Library:
    """``scripts`` as the functions of one library. K, A and ARGV are the library's, set
    by each function as it starts, so that the helpers (made once) see the call's keys
    and arguments; what a function's body declares is its own, made at each call. A
    function keeps the key tables of the last `KNOWN` queues it was called on, by their
    first key: a function's keys are a queue's keys in one order, so the first names the
    rest (the runners send them so), and a table of some 30 keys costs a claim more than
    finding it."""
    parts = ["local K, A, ARGV", HELPERS, *_SHARED]
    for script in scripts:
        keys = ", ".join(f"{k} = KEYS[{i}]" for i, k in enumerate(script.keys, 1))
        args = ", ".join(f"{a} = ARGV[{i}]" for i, a in enumerate(script.args, 1))
        flags = ", ".join(f"'{flag}'" for flag in script.flags.split(",") if flag)
        bind = f"K = {{{keys}}}"
        if script.keys:
            # The keys' table of a queue, made at its first call: the same key names
            # make the same table (see `KNOWN`).
            bind = (
                f"K = known[KEYS[1]]\nif K == nil then\n  K = {{{keys}}}\n"
                f"  if count == {KNOWN} then known, count = {{}}, 0 end\n"
                "  known[KEYS[1]], count = K, count + 1\nend"
            )
        parts.append(
            "do\nlocal known, count = {}, 0\n"
            f"redis.register_function{{function_name = 'NAME_{script.name}', "
            f"flags = {{{flags}}}, callback = function(KEYS, args)\n"
            f"ARGV = args\n{bind}\nA = {{{args}}}\n{_own(script.body)}\nend}}\nend"
        )
    code = "\n".join(parts)
    name = "dt_" + hashlib.sha1(code.encode()).hexdigest()
    return Library(f"#!lua name={name}\n" + code.replace("'NAME_", f"'{name}_"), name)


LIBRARY: Final = library(ALL)
