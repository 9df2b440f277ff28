--[[ check_scope: `fair check` of fair_scope 'app' for a batch of groups (scope_check.py),
each read (and with ARGV[1], repaired) atomically: the app's count of the group's
dispatches in flight (`<ns>:scope:n`) against the sum of its app-scoped queues' own
counts (their `g:<group>` field `n`), and a wfq charge total (`<ns>:scope:charge`) of a
group no app-scoped queue knows. A repaired count is set to the sum; a repaired total is
deleted. Membership of the ready sets follows at each queue's own check (check.lua).
Never on Redis Cluster (the scope is refused there: the keys are the namespace's).
KEYS[1]  "<ns>:{}" (the namespace, as a prefix of no queue)
ARGV[1]  '1': repair
ARGV[2..] the groups to check
Returns: flat {group, kind ('scope_count' | 'scope_charge'), the app's count, then for
'scope_count' the queues' counts as "<queue>\n<n>\n..." } per finding. ]]
-- @include common
local repair = ARGV[1] == '1'
local queues = redis.call('SMEMBERS', SC.key('queues'))
local out = {}
for i = 2, #ARGV do
  local g = ARGV[i]
  local sum, known, parts = 0, false, {}
  for _, q in ipairs(queues) do
    local p = SC.ns .. ':{' .. q .. '}'
    if redis.call('SISMEMBER', p .. ':groups', g) == 1 then known = true end
    local n = tonumber(redis.call('HGET', p .. ':g:' .. g, 'n') or '0')
    if n ~= 0 then
      sum = sum + n
      parts[#parts + 1] = q
      parts[#parts + 1] = n
    end
  end
  local counted = tonumber(redis.call('HGET', SC.key('n'), g) or '0')
  if counted ~= sum then
    if repair and sum > 0 then redis.call('HSET', SC.key('n'), g, sum)
    elseif repair then redis.call('HDEL', SC.key('n'), g) end
    out[#out + 1] = g
    out[#out + 1] = 'scope_count'
    out[#out + 1] = tostring(counted)
    out[#out + 1] = table.concat(parts, '\n')
  end
  local ck = SC.key('charge')
  if not known and (redis.call('HEXISTS', ck, 'i:' .. g) == 1
                    or redis.call('HEXISTS', ck, 'b:' .. g) == 1) then
    if repair then redis.call('HDEL', ck, 'i:' .. g, 'b:' .. g) end
    out[#out + 1] = g
    out[#out + 1] = 'scope_charge'
    out[#out + 1] = tostring(counted)
    out[#out + 1] = ''
  end
end
return out
