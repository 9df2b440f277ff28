--[[ configure: set the fair queue's policy settings and re-rank every group under them.
Runs when a dispatcher starts (settings from app.conf); not on the hot path. Runtime
limits (limit.lua) live in keys of their own: they stay, and are laid over the settings
in `caps`/`weights`, the values in force that every script reads.
Also rebuilds the held counters (`stat` held:i/held:b, `backlog`) from the lists, and the
interactive in-flight count (`stat` inflight:i) from the live dispatches' records.
KEYS[1]  fair queue prefix
ARGV[1]  default cap (-1: none)
ARGV[2]  interactive reserve
ARGV[3]  default weight
ARGV[4]  cap overrides as JSON {group: cap}
ARGV[5]  weight overrides as JSON {group: weight}
ARGV[6]  rate limits as JSON {group: '<interval ms>:<burst>' or 'none'}
ARGV[7]  default rate limit ('<interval ms>:<burst>'; '' for none)
ARGV[8]  the policy: 'wfq', 'harmony' or 'smallest' (common.lua POLICIES); leaving
         'smallest' drops the lists' sort keys (k_keys): the lists stay in the order
         they are, and a later return to 'smallest' places new holds after them
ARGV[9]  the charge: 'cost', 'count' or 'runtime' (common.lua CHARGES; absent: 'cost')
ARGV[10] the cap mode: 'hard' or 'soft' (absent: 'hard'); under 'hard' the over sets are
         emptied, as no group stands over its cap then
ARGV[11] the interactive share: a number in (0, 1], or '' (absent) for none
ARGV[12] the aging under 'smallest' in seconds per unit of cost (fair_aging_seconds):
         a number from 0 to MAX_AGING (absent: DEFAULT_AGING)
ARGV[13] fair_subgroup: 'none' or 'path' (absent: 'none'); a change drops the lists'
         keys (k_keys) and subgroup tags (k_subtags), as leaving 'smallest' does
ARGV[14] fair_scope: 'queue' or 'app' (absent: 'queue'); entering 'app' adds the queue
         to `<ns>:scope:queues` and its groups' in-flight counts to the app's
         (`<ns>:scope:n`), leaving it takes them out again, so the app's count stays
         the sum over the app-scoped queues (common.lua SC)
Returns: number of groups re-ranked.
Error (before anything is written): an unknown policy, charge or cap mode, a share
out of range; a cap, reserve, weight or rate
out of range (common.lua bounds; limits.py checks them first). Buckets and throttles are
left as they are (a restart with the same settings changes nothing) but for the groups
whose rate in force changed: as rate.lua does, their buckets start full and their old
rates' throttles go, not a task's (common.lua `rerate`). ]]
-- @include common
-- @include subcaps
local caps, weights, rates = cjson.decode(ARGV[4]), cjson.decode(ARGV[5]), cjson.decode(ARGV[6])
local function refuse(what, value, expected)
  return redis.error_reply('ERR ' .. what .. ' must be ' .. expected .. ', got ' ..
                           tostring(value))
end
local cap_range = 'an integer from -1 (none) to ' .. MAX_CAP
local weight_range = 'a finite number between ' .. MIN_WEIGHT .. ' and ' .. MAX_WEIGHT
if not valid_cap(ARGV[1]) then return refuse('default cap', ARGV[1], cap_range) end
local reserve = valid_cap(ARGV[2])
if not reserve or reserve < 0 then
  return refuse('interactive reserve', ARGV[2], 'an integer from 0 to ' .. MAX_CAP)
end
if not valid_weight(ARGV[3]) then return refuse('default weight', ARGV[3], weight_range) end
for g, v in pairs(caps) do
  if not valid_cap(v) then return refuse('cap for group ' .. g, v, cap_range) end
end
for g, v in pairs(weights) do
  if not valid_weight(v) then return refuse('weight for group ' .. g, v, weight_range) end
end
local rate_form = "'<interval ms>:<burst>' or 'none'"
for g, v in pairs(rates) do
  if not valid_rate(v) then return refuse('rate limit for group ' .. g, v, rate_form) end
end
if ARGV[7] ~= '' and not parse_rate(ARGV[7]) then
  return refuse('default rate limit', ARGV[7], rate_form)
end
if not POLICIES[ARGV[8]] then
  return refuse('policy', ARGV[8], "'wfq', 'harmony' or 'smallest'")
end
local conf_aging = ARGV[12] or tostring(DEFAULT_AGING)
if not valid_aging(conf_aging) then
  return refuse('aging', conf_aging, 'a number of seconds from 0 to ' .. MAX_AGING)
end
local charge = ARGV[9] or 'cost'
if ARGV[13] and ARGV[13] ~= 'none' and ARGV[13] ~= 'path' then
  return refuse('subgroup', ARGV[13], "'none' or 'path'")
end
local scope = ARGV[14] or 'queue'
if scope ~= 'queue' and scope ~= 'app' then
  return refuse('scope', scope, "'queue' or 'app'")
end
if not CHARGES[charge] then
  return refuse('charge', charge, "'cost', 'count' or 'runtime'")
end
local capmode, ishare = ARGV[10] or 'hard', ARGV[11] or ''
if capmode ~= 'hard' and capmode ~= 'soft' then
  return refuse('cap mode', capmode, "'hard' or 'soft'")
end
local share = tonumber(ishare)
if ishare ~= '' and not (share and share > 0 and share <= 1) then
  return refuse('interactive share', ishare, 'a number greater than 0 and at most 1')
end
local before = {}  -- the rates in force of the groups with a bucket (rerate below)
for _, g in ipairs(redis.call('ZRANGE', K_TATS, 0, -1)) do before[g] = {rate_of(g)} end
local policy_before = redis.call('HGET', K_CONF, 'policy') or 'wfq'
local sub = ARGV[13] or 'none'
local sub_before = redis.call('HGET', K_CONF, 'subgroup') or 'none'
if (policy_before == 'smallest' and ARGV[8] ~= 'smallest') or sub_before ~= sub then
  -- the lists keep their order; the sort keys would go stale as ids come and go
  for _, g in ipairs(redis.call('SMEMBERS', K_GROUPS)) do
    for _, cls in ipairs(CLASSES) do
      redis.call('DEL', k_keys(cls, g))
      redis.call('DEL', k_subtags(cls, g))
    end
  end
end
if policy_before ~= ARGV[8] then
  -- the ready sets' scores change meaning (tags, ranks): every group enters them anew
  for _, cls in ipairs(CLASSES) do
    redis.call('DEL', k_ready(cls))
    redis.call('DEL', k_over(cls))
  end
end
redis.call('HSET', K_CONF, 'cap', ARGV[1], 'reserve', ARGV[2], 'weight', ARGV[3],
           'policy', ARGV[8], 'charge', charge, 'capmode', capmode, 'aging', conf_aging,
           'subgroup', sub)
local scope_before = redis.call('HGET', K_CONF, 'scope') or 'queue'
if scope_before ~= scope then  -- the app's counts gain or lose this queue's
  local sign = scope == 'app' and 1 or -1
  SC.read = true
  for _, g in ipairs(redis.call('SMEMBERS', K_GROUPS)) do
    local n = inflight_of(g)
    if n ~= 0 then SC.add(g, sign * n) end
    if sign > 0 then  -- nothing owed from before (as a group entering a set)
      for _, cls in ipairs(CLASSES) do SC.entered(cls, g) end
    else  -- nothing left behind (as a group forgotten)
      SC.forgot(g)
    end
  end
  if scope == 'app' then redis.call('SADD', SC.key('queues'), SC.queue)
  else redis.call('SREM', SC.key('queues'), SC.queue) end
end
redis.call('HSET', K_CONF, 'scope', scope)
SC.read = nil
if ishare == '' then redis.call('HDEL', K_CONF, 'ishare') else redis.call('HSET', K_CONF, 'ishare', ishare) end
policy_read, soft_read, aging_read, subgroup_read = nil, nil, nil, nil  -- the refreshes below rank under the new policy
if capmode == 'hard' then
  for _, cls in ipairs(CLASSES) do redis.call('DEL', k_over(cls)) end
end
if ARGV[7] == '' then redis.call('HDEL', K_CONF, 'rate') else redis.call('HSET', K_CONF, 'rate', ARGV[7]) end
-- The settings, kept apart (a limit's --reset restores them), then in force with the
-- runtime limits laid over them.
for _, k in ipairs({{K_CONF_CAPS, K_CAPS, K_LIMIT_CAPS, caps, valid_cap},
                    {K_CONF_WEIGHTS, K_WEIGHTS, K_LIMIT_WEIGHTS, weights, valid_weight},
                    {K_CONF_RATES, K_RATES, K_LIMIT_RATES, rates, valid_rate}}) do
  local settings, in_force, limits, valid = k[1], k[2], k[3], k[5]
  redis.call('DEL', settings, in_force)
  for g, v in pairs(k[4]) do
    redis.call('HSET', settings, g, v)
    redis.call('HSET', in_force, g, v)
  end
  local limited = redis.call('HGETALL', limits)
  for i = 1, #limited, 2 do  -- a damaged limit (an older version's) is left to `check`
    if valid(limited[i + 1]) then redis.call('HSET', in_force, limited[i], limited[i + 1]) end
  end
end
-- conf `pathcaps`: '1' while some cap in force is keyed by a path (pick.lua parks heads
-- only then: caps per subgroup)
local pathcaps = false
for _, g in ipairs(redis.call('HKEYS', K_CAPS)) do
  if string.find(g, '/', 1, true) then pathcaps = true break end
end
if pathcaps then redis.call('HSET', K_CONF, 'pathcaps', '1') else redis.call('HDEL', K_CONF, 'pathcaps') end
for g, r in pairs(before) do rerate(g, r[1], r[2]) end  -- refreshed below
-- caps per subgroup: parked work the new caps or setting leave room for comes back (all
-- of it when no cap binds its subgroup, as when the setting leaves 'path'); what stays
-- parked is still held, counted below
local parked_paths, parked_n, held = {}, {}, {i = 0, b = 0}
local function parked_list(member)  -- "<class>:<group>/<subgroup>" -> class, group, subgroup
  local slash = string.find(member, '/', 3, true)
  return string.sub(member, 1, 1), string.sub(member, 3, slash - 1), string.sub(member, slash + 1)
end
for _, member in ipairs(redis.call('SMEMBERS', SUBCAPS.parked)) do
  local _, g, sg = parked_list(member)
  parked_paths[g .. '/' .. sg] = {g, sg}
end
for _, gs in pairs(parked_paths) do SUBCAPS.unpark(gs[1], gs[2]) end
for _, member in ipairs(redis.call('SMEMBERS', SUBCAPS.parked)) do
  local cls, g, sg = parked_list(member)
  local len = redis.call('LLEN', SUBCAPS.key(cls, g, sg))
  held[cls], parked_n[g] = held[cls] + len, (parked_n[g] or 0) + len
end
local groups = redis.call('SMEMBERS', K_GROUPS)
-- The held counters are rebuilt while every group is visited anyway: they become exact
-- again after anything that bypassed the scripts (a store written by an older version).
redis.call('DEL', K_BACKLOG)
for _, g in ipairs(groups) do
  refresh(g, tonumber(ARGV[1]))
  local n = parked_n[g] or 0
  for _, cls in ipairs(CLASSES) do
    local len = redis.call('LLEN', k_list(cls, g))
    held[cls] = held[cls] + len
    n = n + len
  end
  if n > 0 then redis.call('ZADD', K_BACKLOG, n, g) end
end
redis.call('HSET', K_STAT, 'held:i', held.i, 'held:b', held.b)
-- ... and so does the interactive in-flight count (the interactive share), from the live
-- dispatches (each has a lease): exact again after a version that did not keep it
local interactive = 0
for _, did in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
  if redis.call('HGET', k_dispatch(did), 'c') == 'i' then interactive = interactive + 1 end
end
redis.call('HSET', K_STAT, 'inflight:i', interactive)
wake()
return #groups
