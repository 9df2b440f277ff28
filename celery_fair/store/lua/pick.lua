--[[ pick: take up to ARGV[2] held messages in fair order and mark each dispatch 'picked'.
Policy wfq: interactive groups come first; within a class the group with the lowest
virtual start tag wins (ZSET head: O(log G)), and its tag advances by its charge / weight
(policy `charged`): the cost; 1 under `charge` 'count'; under 'runtime' an estimate, the
group's mean runtime (`r`) or else the cost, kept in the dispatch record (`e`) for
release.lua to correct.
Policy harmony: the lower head of the two ready sets wins (its rank: fewest in flight per
unit of weight, then served least recently; interactive first in a tie, so inside a
group interactive goes before background); the group's last-served sequence becomes the
queue's pick count `stat` `served` and it is re-ranked in both classes. A rate-limited
group whose bucket runs empty is throttled: it leaves the ready sets until promote.lua
lifts it, so the pick never scans a group that may not go.
Soft caps (conf `capmode` 'soft'): only when both ready sets are empty, the pick falls
back to the over sets (groups at or over their cap with work held), in the same order.
Interactive share (conf `ishare`): while the queue's interactive dispatches in flight
(`stat` `inflight:i`) are at least the share of the capacity and the background set (of
the same kind) holds a group, the pick takes from it first.
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most messages to take
ARGV[3]  capacity of the fair queue (-1: none); counts every in-flight dispatch
ARGV[4]  lease of a picked dispatch in ms (how long the dispatcher may take to publish)
ARGV[5]  dispatch id prefix; ids are <prefix><call>.<n>, <call> counted in `stat` `picks`:
         a call that reaches Redis twice (redis-py resending it after its reply was lost
         to a dropped connection, a pipeline retried after NOSCRIPT) must not give out an
         id again, or its second record would overwrite the first's (another task's slot)
Direct push (optional; only when the broker is kombu's Redis transport on this same Redis
server and database, see direct.py):
ARGV[6]  the real queue (kombu's list) to push messages into
ARGV[7]  kombu's priority separator
ARGV[8]  kombu's priority steps, ascending, comma separated ("0,3,6,9")
ARGV[9]  lease deadline in ms of a queued dispatch (what confirm.lua would set); the pushed
         message carries it as its header `fair_lease_until`
ARGV[10] the queue's own direct exchange ('' for none) ...
ARGV[11] ... its routing key
ARGV[12] ... and kombu's binding set of that exchange ("_kombu.binding.<exchange>"); a
         broker key, which is why direct push is never used on Redis Cluster
Affinity (fair_affinity 'hash'; never with the direct push, whose ARGV[6] is '' then):
ARGV[13] the live workers and what each may have in flight: "<worker>\n<limit>\n..."
ARGV[14] the spill time in ms (-1: never); see include/routing.lua
Refill (optional; direct push only):
ARGV[15] how long in ms the refill parameters last: this call's capacity, leases, id
         prefix, direct push and ARGV[2] are written to `refill` (HASH) for release.lua,
         which then picks into the slot it frees itself and no longer wakes the
         dispatcher ('' or absent: not written; what is there expires)
Before its own picks, the call returns what release.lua refilled since the last pick
(list `refilled`: the dispatcher logs and counts them) and the dispatches it took but
could not push (list `handoff`: the dispatcher publishes them), those still 'picked'.
A message addressed to the queue by name, or through that exchange and routing key while
every binding of that routing key leads to this queue alone, is pushed into the queue's
list as kombu would publish it, and its dispatch is 'queued' at once: no publish round
trip, no window between pick and publish. Anything else (another route, an `expires`
header, a value stored before headers had a part of their own) is returned as usual.
Each group taken from gets its head time (`h<class>` in `g:<group>`) stamped now, once
per group and call: the next message of that list is the head since now.
Returns: flat array {dispatch id, hold id, stored value, ...}; in direct mode preceded by
the number of messages pushed and, for each of them, its class, due time (meta `t`, or ''),
group, hold id and dispatch id. With affinity: {that array, the worker of each picked
message in order, the groups met without a live worker assigned}. A held message that
cannot be decoded moves to `quarantine` and comes back as {'', hold id, ''} (so it is
logged). ]]
-- @include common
-- @include singleton
-- @include kombu
-- @include routing
-- @include subcaps
-- @include picking
local routed_mode = ARGV[13] and ARGV[13] ~= ''
local push_mode = ARGV[6] and ARGV[6] ~= ''
if push_mode and ARGV[15] and ARGV[15] ~= '' then
  -- one HSET and PEXPIRE per step; release.lua reads them back in one HMGET
  redis.call('HSET', RF.params, 'q', ARGV[6], 'sep', ARGV[7], 'steps', ARGV[8],
             'ex', ARGV[10], 'rk', ARGV[11], 'bk', ARGV[12], 'cap', ARGV[3],
             'lease', ARGV[4], 'qlease', tonumber(ARGV[9]) - tonumber(ARGV[1]),
             'tok', ARGV[5], 'want', ARGV[2])
  redis.call('PEXPIRE', RF.params, ARGV[15])
end
local function drained(k)
  local items = redis.call('LRANGE', k, 0, -1)
  if #items > 0 then redis.call('DEL', k) end
  return items
end
-- without the direct push the answer has no place for them: left for a pick that has
local told = push_mode and drained(RF.told) or nil
local handed = nil
if not routed_mode then
  handed = {}
  for _, did in ipairs(drained(RF.handed)) do
    -- reclaim (the step's call before this one) may have taken a lapsed one back
    local state, id, value = unpack(redis.call('HMGET', k_dispatch(did), 's', 'id', 'v'))
    if state == 'picked' then
      handed[#handed + 1] = did
      handed[#handed + 1] = id
      handed[#handed + 1] = value
    end
  end
end
local answer = PICK.run(ARGV, told, handed)
-- a group this pick throttled: the dispatcher's next step (its promote) learns when it is
-- lifted; releases that refill its slots no longer wake it
if PICK.throttled then wake() end
return answer
