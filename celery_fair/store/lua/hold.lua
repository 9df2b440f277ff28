--[[ hold: keep a published message in its group until a dispatcher picks it.
KEYS[1]  fair queue prefix
ARGV[1]  hold id (the task id); made unique with a suffix if already held, unless what is
         held under it is this very value: the same publication reaching Redis twice
         (redis-py resends a call whose reply a dropped connection lost), held once
ARGV[2]  stored value (envelope.py layout: class, front, cost, group, message)
ARGV[3]  due time in ms (0: now)
ARGV[4]  now in ms
ARGV[5]  group  } the placement, given by the caller (Store.hold takes it as arguments;
ARGV[6]  class  } RedisStore checked it with check_hold): this script places the message
ARGV[7]  cost   } by these, and never derives them from the value
ARGV[8]  front ('1': at the head of its group, a retry; '0': at its tail)
ARGV[9]  max held ('': unlimited): backpressure (fair_group_max_held); refuse the hold
         when the group already holds this many messages (both classes' lists and its
         delayed ones). A resend of what is held under ARGV[1] is never refused.
ARGV[11] singleton key ('' or absent: none; include/singleton.lua): a message held now
         whose key has an owner waits in the key's list
ARGV[12] 'drop' (singleton_mode): refuse the hold when the key has a message waiting
ARGV[10] seconds to remember what was held under task id ARGV[1] (k_sent; '' or 0:
         not at all): the same message published again within them (its hold time aside:
         a caller told HoldOutcomeUnknown or HoldNotReplicated sends it again) is not held
         again, whether the first is still held, dispatched or has run; its hold id is
         returned. Another message under that task id (a retry: its retries count) is held.
A message that becomes its list's head (to the front, or into an empty list) stamps the
group's head time of its class (`h<class>` in `g:<group>`: ARGV[4]).
Returns: the hold id used.
Errors (before anything is written): DROPPED <hold id> <key> (ARGV[12]); FULL <count> <limit> <group> when the
group is full; CORRUPT when the value's prefix is not envelope.py's
encoding of this placement; ERR for a placement out of range, a due time that is not a
number, a key of a foreign type.
The checks and writes are include/holding.lua's (hold_many.lua shares them).
Wakes dispatchers when the group became ready or the message is the next one due.
Refill: while a dispatcher's refill parameters are there (release.lua says how) and the
queue has room, a message held for now is picked and pushed in this same call (an idle
queue's added latency is then this script, not a dispatcher's step), and the dispatcher
is not woken for it. ]]
-- @include common
-- @include singleton
-- @include kombu
-- @include routing
-- @include subcaps
-- @include holding
-- @include picking
local id, value = ARGV[1], ARGV[2]
local due, now = finite(ARGV[3]), finite(ARGV[4])
local g, cls, cost, front = ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8] == '1'
local refused = hold_refusal(id, value, due, now, g, cls, cost, front)
if refused then return redis.error_reply(refused) end
local held = redis.call('HGET', K_MSG, id)
if held == value then return id end
local remember = tonumber(ARGV[10]) or 0
local digest = remember > 0 and sent_digest(value) or nil
if digest then
  local earlier = sent_before(id, digest)
  if earlier then return earlier end
end
local max_held = tonumber(ARGV[9])
if max_held then
  local n = held_of(g)
  if n >= max_held then return redis.error_reply('FULL ' .. n .. ' ' .. ARGV[9] .. ' ' .. g) end
end
local key = ARGV[11] ~= '' and ARGV[11] or nil
if key and ARGV[12] == 'drop' and singleton_drops(key) then
  return redis.error_reply('DROPPED ' .. id .. ' ' .. key)
end
local known = preflight(g, due > now, id)
local hold_id, ready = hold_write(id, value, held, due, now, g, cls, front, known, key, true)
if digest then remember_sent(id, digest, hold_id, remember) end
-- a refill that took something leaves the dispatcher asleep: what it would do is done
-- (waking it would put its step beside the worker starting the task, on the same cores)
local taken = due <= now and PICK.refill(now)
if ready and not (taken and taken > 0) then wake() end
return hold_id
