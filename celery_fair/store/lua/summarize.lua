--[[ summarize: figures of some groups of a fair queue, for the summary (reads only).
The caller passes the groups it lists (the busiest few, from the `backlog` ranking) in
chunks, so one call stays short; the queue's totals come from `stat`, not from here.
KEYS[1]  fair queue prefix
ARGV     group names
Returns: flat array, eight entries per group in ARGV order: held interactive, held
background (parked work too), in flight, delayed, the due time (epoch seconds, as a string; '' for an
empty list or a message held before due times were recorded) of the head of each class's
list, interactive first, and when each became the head (`h<class>` of `g:<group>`, ms,
as a string; '' for an empty list or a head stamped before head times were kept). The due time is meta field `t`, first in the meta JSON
(envelope.py), so it is read without decoding the message. ]]
-- @include common
-- @include subcaps
local function head_due(cls, g)
  local id = redis.call('LINDEX', k_list(cls, g), 0)
  local v = id and redis.call('HGET', K_MSG, id)
  if not v then return '' end
  local p1 = string.find(v, ':', 3, true)
  local p2 = p1 and string.find(v, ':', p1 + 1, true)
  local glen = p2 and tonumber(string.sub(v, p1 + 1, p2 - 1))
  if not glen then return '' end
  return string.match(v, '^{"t": ?([%d%.eE+-]+)', p2 + glen + 1) or ''
end

local out = {}
for _, g in ipairs(ARGV) do
  local counts = redis.call('HMGET', k_group(g), 'n', 'd', 'hi', 'hb')
  local held_i, held_b = redis.call('LLEN', k_list('i', g)), redis.call('LLEN', k_list('b', g))
  out[#out + 1] = held_i + SUBCAPS.held('i', g)  -- parked (caps per subgroup): held too
  out[#out + 1] = held_b + SUBCAPS.held('b', g)
  out[#out + 1] = tonumber(counts[1] or '0')
  out[#out + 1] = tonumber(counts[2] or '0')
  out[#out + 1] = head_due('i', g)
  out[#out + 1] = head_due('b', g)
  out[#out + 1] = held_i > 0 and counts[3] or ''
  out[#out + 1] = held_b > 0 and counts[4] or ''
end
return out
