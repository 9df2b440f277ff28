--[[ check: verify the invariants of one fair queue in one atomic read; with ARGV[1] = 1,
also repair what it finds. Atomic, so a live dispatcher, workers and publishers never
show a half-done operation to it. Runs in O(held + in flight + groups): Redis is busy
for that long (a few ms per 10,000 held messages).
Nothing held is dropped: a message no list refers to is held again, an undecodable one
moves to `quarantine`, a key of a foreign type is renamed aside, never deleted.
KEYS[1]  fair queue prefix
ARGV[1]  1 repair, 0 only report
ARGV[2]  now in ms
ARGV[3]  lease in ms given to an in-flight dispatch found without one
ARGV[4]  JSON list of group names found outside the `groups` set (SCAN of q:* and g:*)
ARGV[5]  JSON list of dispatch ids found outside `leases` (SCAN of d:*)
Returns: flat array {kind, subject, detail, action, ...}; action is '' when nothing was
done (report mode, or a finding that cannot be repaired). ]]
-- @include common
local repair, now, lease_ms = ARGV[1] == '1', tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}

local function finding(kind, subject, detail, action)
  out[#out + 1] = kind
  out[#out + 1] = subject
  out[#out + 1] = detail
  out[#out + 1] = repair and action or ''
end

-- A key of a type we never write blocks every script touching it: rename it aside.
local function foreign(key, want)
  local t = redis.call('TYPE', key).ok
  if t == 'none' or t == want then return false end
  local aside = prefix .. ':foreign:' .. string.sub(key, #prefix + 2) .. ':' .. now
  finding('foreign_key', key, 'is a ' .. t .. ', expected a ' .. want,
          'renamed to ' .. aside)
  if repair then redis.call('RENAME', key, aside) end
  return not repair
end

local fixed = {{K_MSG, 'hash'}, {K_STAT, 'hash'}, {K_VT, 'hash'}, {K_CONF, 'hash'},
               {K_CAPS, 'hash'}, {K_WEIGHTS, 'hash'}, {K_GROUPS, 'set'},
               {K_DELAYED, 'zset'}, {K_LEASES, 'zset'}, {K_WAKE, 'list'},
               {K_QUARANTINE, 'hash'}, {k_ready('i'), 'zset'}, {k_ready('b'), 'zset'},
               {K_BACKLOG, 'zset'}, {K_CONF_CAPS, 'hash'}, {K_CONF_WEIGHTS, 'hash'},
               {K_LIMIT_CAPS, 'hash'}, {K_LIMIT_WEIGHTS, 'hash'}}
local blocked = false
for _, kt in ipairs(fixed) do
  if foreign(kt[1], kt[2]) then blocked = true end
end
if blocked then return out end  -- report mode: the other checks would fail on it

local groups, group_list = {}, {}
local function note(g)
  if g and not groups[g] then
    groups[g] = true
    group_list[#group_list + 1] = g
  end
end
for _, g in ipairs(redis.call('SMEMBERS', K_GROUPS)) do note(g) end
for _, g in ipairs(cjson.decode(ARGV[4])) do note(g) end
for _, cls in ipairs(CLASSES) do
  for _, g in ipairs(redis.call('ZRANGE', k_ready(cls), 0, -1)) do note(g) end
end
for _, g in ipairs(redis.call('ZRANGE', K_BACKLOG, 0, -1)) do note(g) end

-- Held messages: decodable, and referred to exactly once (a group list or `delayed`).
local msgs, refs = {}, {}
for _, id in ipairs(redis.call('HKEYS', K_MSG)) do
  local v = redis.call('HGET', K_MSG, id)
  local m = decode(v)
  if m then
    msgs[id], refs[id] = m, 0
    note(m.g)
  else
    finding('corrupt_message', id, 'stored value cannot be decoded',
            'moved to ' .. K_QUARANTINE)
    if repair then quarantine(id, v, 'check: undecodable stored value') end
  end
end

local delayed_of = {}
for _, id in ipairs(redis.call('ZRANGE', K_DELAYED, 0, -1)) do
  local m = msgs[id]
  if not m then
    finding('delayed_without_body', id, 'in the delayed set but not in msg', 'removed')
    if repair then redis.call('ZREM', K_DELAYED, id) end
  else
    refs[id] = refs[id] + 1
    delayed_of[m.g] = (delayed_of[m.g] or 0) + 1
  end
end

local held_of, skip = {}, {}  -- skip: groups with a foreign key (report mode)
local held_total = {i = 0, b = 0}
local function check_list(cls, g)
  local key = k_list(cls, g)
  if foreign(key, 'list') then skip[g] = true; return end
  for _, id in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local m = msgs[id]
    if not m then
      finding('held_without_body', g, 'id ' .. id .. ' in ' .. key .. ' has no message',
              'removed from the list')
      if repair then redis.call('LREM', key, 1, id) end
    elseif m.g ~= g or m.cls ~= cls or refs[id] > 0 then
      finding('misplaced_id', g, 'id ' .. id .. ' in ' .. key .. ' belongs to group ' ..
              m.g .. ' class ' .. m.cls .. ' and is referred to ' .. refs[id] .. ' times',
              'removed from the list')
      if repair then redis.call('LREM', key, -1, id) end
    else
      refs[id] = 1
      held_of[g] = (held_of[g] or 0) + 1
      held_total[cls] = held_total[cls] + 1
    end
  end
end
for _, g in ipairs(group_list) do
  if foreign(k_group(g), 'hash') then skip[g] = true end
  for _, cls in ipairs(CLASSES) do check_list(cls, g) end
end

for id, m in pairs(msgs) do
  if refs[id] == 0 then
    finding('orphan_message', id, 'held for group ' .. m.g .. ' but in no list',
            'held again in ' .. k_list(m.cls, m.g))
    held_of[m.g] = (held_of[m.g] or 0) + 1
    held_total[m.cls] = held_total[m.cls] + 1
    if repair then
      if m.front then redis.call('LPUSH', k_list(m.cls, m.g), id)
      else redis.call('RPUSH', k_list(m.cls, m.g), id) end
      redis.call('SADD', K_GROUPS, m.g)
    end
  end
end

-- Dispatch records: every in-flight one (picked, queued, running) has a lease and counts
-- in its group's `n` and in `stat inflight`; finished ones (superseded, lost, released)
-- have none.
local active = {picked = true, queued = true, running = true}
local finished = {superseded = true, lost = true, released = true}
local leased, dids = {}, {}
for _, did in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
  leased[did] = true
  dids[#dids + 1] = did
end
for _, did in ipairs(cjson.decode(ARGV[5])) do
  if not leased[did] then dids[#dids + 1] = did end
end
local inflight_of_group, total = {}, 0
for _, did in ipairs(dids) do
  local dk = k_dispatch(did)
  local state, g, v = unpack(redis.call('HMGET', dk, 's', 'g', 'v'))
  if active[state] and g then
    note(g)
    inflight_of_group[g] = (inflight_of_group[g] or 0) + 1
    total = total + 1
    if not leased[did] then
      finding('dispatch_without_lease', did, state .. ' dispatch of group ' .. g ..
              ' has no lease: its slot would never come back', 'lease added')
      if repair then redis.call('ZADD', K_LEASES, now + lease_ms, did) end
    end
    if state == 'picked' and not v then
      finding('picked_without_message', did, 'picked dispatch has lost its message bytes',
              'marked queued (its lease frees the slot if no worker has it)')
      if repair then redis.call('HSET', dk, 's', 'queued') end
    end
  elseif leased[did] then
    -- a released dispatch's tombstone is its id in k_done (release.lua), not a record
    if not state and redis.call('HEXISTS', k_done(did), did) == 1 then state = 'released' end
    local what = state and (state .. ' dispatch') or 'no record'
    if state and not finished[state] then what = 'bad record (state ' .. state .. ')' end
    finding('lease_without_dispatch', did, 'lease on ' .. what, 'lease removed')
    if repair then redis.call('ZREM', K_LEASES, did) end
  end
end

-- Per group: counters, membership of `groups` and of the ready sets.
local function check_group(g)
  local gk = k_group(g)
  local want_n, want_d = inflight_of_group[g] or 0, delayed_of[g] or 0
  local n = tonumber(redis.call('HGET', gk, 'n') or '0')
  local d = tonumber(redis.call('HGET', gk, 'd') or '0')
  if n ~= want_n then
    finding('group_inflight', g, 'n is ' .. n .. ', dispatch records say ' .. want_n,
            'set to ' .. want_n)
    if repair then redis.call('HSET', gk, 'n', want_n) end
  end
  if d ~= want_d then
    finding('group_delayed', g, 'd is ' .. d .. ', the delayed set says ' .. want_d,
            'set to ' .. want_d)
    if repair then redis.call('HSET', gk, 'd', want_d) end
  end
  local held = held_of[g] or 0
  local ranked = tonumber(redis.call('ZSCORE', K_BACKLOG, g) or '0')
  if ranked ~= held then
    finding('group_held_count', g, 'backlog counts ' .. ranked .. ', its lists hold ' .. held,
            'set to ' .. held)
    if repair and held > 0 then redis.call('ZADD', K_BACKLOG, held, g)
    elseif repair then redis.call('ZREM', K_BACKLOG, g) end
  end
  local busy = want_n > 0 or want_d > 0 or held > 0
  local member = redis.call('SISMEMBER', K_GROUPS, g) == 1
  if busy and not member then
    finding('group_unregistered', g, 'has work but is not in the groups set', 'added')
    if repair then redis.call('SADD', K_GROUPS, g) end
  elseif not busy and (member or redis.call('EXISTS', gk) == 1) then
    finding('idle_group', g, 'holds, waits for and runs nothing but is still kept',
            'forgotten')
    if repair then redis.call('DEL', gk); redis.call('SREM', K_GROUPS, g) end
  end
  local n_now = tonumber(redis.call('HGET', gk, 'n') or '0')
  local stale = false
  for _, cls in ipairs(CLASSES) do
    local score = redis.call('ZSCORE', k_ready(cls), g)
    local should = busy and eligible(cls, g, n_now)
    local tag = tonumber(redis.call('HGET', gk, 't' .. cls) or '0')
    if should and not score then
      finding('not_ready', g, 'eligible for class ' .. cls .. ' but not in its ready set',
              'ready set refreshed')
      stale = true
    elseif score and not should then
      finding('ready_but_ineligible', g, 'in the ready set of class ' .. cls ..
              ' but holds nothing there or is at its cap', 'ready set refreshed')
      stale = true
    elseif score and tonumber(score) ~= tag then
      finding('ready_tag_mismatch', g, 'ready score ' .. score .. ' differs from its tag ' ..
              tag .. ' in class ' .. cls, 'ready set refreshed')
      stale = true
    end
  end
  if repair and stale then refresh(g) end
end
for _, g in ipairs(group_list) do
  if not skip[g] then check_group(g) end
end

for _, cls in ipairs(CLASSES) do
  local counted = tonumber(redis.call('HGET', K_STAT, 'held:' .. cls) or '0')
  if counted ~= held_total[cls] then
    finding('queue_held_count', 'stat', 'held:' .. cls .. ' is ' .. counted ..
            ', the lists hold ' .. held_total[cls], 'set to ' .. held_total[cls])
    if repair then redis.call('HSET', K_STAT, 'held:' .. cls, held_total[cls]) end
  end
end
local inflight = tonumber(redis.call('HGET', K_STAT, 'inflight') or '0')
if inflight ~= total then
  finding('queue_inflight', 'stat', 'inflight is ' .. inflight .. ', dispatch records say ' ..
          total, 'set to ' .. total)
  if repair then redis.call('HSET', K_STAT, 'inflight', total) end
end
if repair and #out > 0 then wake() end
return out
