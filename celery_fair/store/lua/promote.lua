--[[ promote: move delayed messages (ETA, countdown, retry) that are due into their group,
and lift the throttles (rate limits, a task's fair_throttle) that end by now. A TAT up to
RATE_EARLY_MS past is kept: a token counts from its time or RATE_EARLY_MS before the
pick, the later (pick.lua `meter`), so a dispatcher's lateness never adds up into a
slower rate.
A retry enters at the head of its group, anything else at the tail; one that becomes its
list's head stamps the group's head time of its class (`h<class>`: now).
KEYS[1]  fair queue prefix
ARGV[1]  now in ms
ARGV[2]  most messages to move, and most throttles to lift
Waiters of singleton keys other queues handed this one (their keys passed on to them)
enter their group's list at the head of their class first (include/singleton.lua).
Under fair_scope 'app', the groups another queue freed a slot of are refreshed first
(common.lua SC.admit).
Returns: {moved (with those), when to step next in ms (the next delayed message's due time or the
next throttle's lift, whichever is sooner) or -1, {quarantined ids}}: a due message
that cannot be decoded moves to `quarantine` instead. ]]
-- @include common
-- @include singleton
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local moved, bad = SG.admitted(ARGV[1]), {}  -- waiters other queues handed it
SC.admit()  -- fair_scope 'app': groups another queue freed a slot of
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', K_DELAYED, id)
  local value = redis.call('HGET', K_MSG, id)
  local m = value and decode(value)
  if value and not m then
    quarantine(id, value, 'promote: undecodable stored value')
    bad[#bad + 1] = id
  elseif m then
    local cls, front, g = m.cls, m.front, m.g
    redis.call('HINCRBY', k_group(g), 'd', -1)
    local key = singleton_any() and redis.call('HGET', K_SKEY, id)
    if not key or singleton_enter(id, key, front) then
      push_held(cls, g, id, front, ARGV[1])
      count_held(cls, g, 1)
      refresh(g)
    else  -- it waits for its key, in no group: its group may have nothing else now
      forget_if_idle(g)
    end
    moved = moved + 1
  end
end
for _, g in ipairs(redis.call('ZRANGEBYSCORE', K_THROTTLED, '-inf', now,
                              'LIMIT', 0, limit)) do
  redis.call('ZREM', K_THROTTLED, g)
  refresh(g)
end
redis.call('ZREMRANGEBYSCORE', K_TATS, '-inf', now - RATE_EARLY_MS)  -- meter: a full bucket
local nxt = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')[2]
nxt = nxt and tonumber(nxt)
local throttled = redis.call('ZRANGE', K_THROTTLED, 0, 0, 'WITHSCORES')[2]
if throttled then  -- policy `throttle_due`
  local lift = math.ceil(tonumber(throttled))
  if not nxt or lift < nxt then nxt = lift end
end
return {moved, nxt or -1, bad}
