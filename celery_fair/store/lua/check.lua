--[[ check: verify the invariants of one fair queue, one bounded step per call; with
ARGV[1] = 1, also repair what it finds. RedisStore.check runs the steps in order:
  fixed     key types of the fixed keys, stored numbers; clears the scratch keys
  lists     group lists, up to `batch` ids a call (a list visited counts as one), each
            from its tail: each id has its message, of that group and class, and is not
            also delayed; seen ids go to `check:seen`
  delayed   ZSCAN of `delayed`: each id has its message; counted per group
  msg       HSCAN of `msg`: each message decodes; one not seen in a list or `delayed` is
            re-verified at once (ZSCORE, LPOS from the end its hold pushed it to) before
            it is called an orphan (held again by a repair: a new head stamps its head
            time, as hold.lua does; head times are never checked, so a head without one,
            written before they were kept, is no finding)
  dispatch  ZSCAN of `leases`, then the dispatch ids the key SCAN found: each record;
            in-flight records counted per group
  group     up to `batch` groups: held count (exact), membership, ready sets, tags;
            in-flight and delayed counts compared with the tallies, a disagreement only
            marks the group a suspect
  final     suspects re-counted exactly and checked in this one atomic call, then the
            queue's totals
Each call is atomic and reads at most about `batch` entries, so Redis is never blocked
for long and the check is safe beside live dispatchers, workers and publishers. A fact
about one entry is checked within one call, so it is exact. A count that sums entries
read in several calls (delayed and in flight per group, the queue's totals) may be off
by the work done meanwhile, so it is never reported from the tallies alone: `final`
re-counts it atomically, and only when a tally disagrees: O(in flight) for the groups
whose in-flight count moved, O(delayed) more when a delayed count moved, O(groups) O(1)
reads for the totals. One check per queue at a time (ARGV[6]).
Nothing held is dropped: a message no list refers to is held again, an undecodable one
moves to `quarantine`, a key of a foreign type is renamed aside, never deleted.
KEYS[1]  fair queue prefix
ARGV[1]  1 repair, 0 only report
ARGV[2]  now in ms
ARGV[3]  lease in ms given to an in-flight dispatch found without one
ARGV[4]  step (above)
ARGV[5]  batch: most entries one call reads
ARGV[6]  this check's token: step fixed makes it the queue's check in progress; any other
         step of an older check then fails (error reply, nothing written), since the
         scratch tallies are the newer check's now
ARGV[7]  lists, group: JSON list of groups; delayed, msg, dispatch: scan cursor
ARGV[8]  lists: where to resume ('' at the start; else the previous call's `next`);
         dispatch: JSON list of the dispatch ids the key SCAN found outside `leases`
         (read once the cursor is done)
Returns: flat array {next, read, kind, subject, detail, action, ...}: `next` the cursor
(or resume point) for the next call of this step, '' when the step is done; `read` the
entries this call read; action is '' when nothing was done (report mode, or a finding
that cannot be repaired). Step fixed: `next` is 'blocked' when a foreign key stops the
rest (report mode). ]]
-- @include common
-- @include singleton
-- @include subcaps
local repair, now, lease_ms = ARGV[1] == '1', tonumber(ARGV[2]), tonumber(ARGV[3])
local step, batch, token = ARGV[4], tonumber(ARGV[5]), ARGV[6]
local out = {'', 0}
-- Scratch keys of a check in progress (a TTL in case it is interrupted).
local K_SEEN = prefix .. ':check:seen'     -- SET hold ids a list or `delayed` refers to
-- HASH n:<g>, d:<g>, inflight, held:<cls>; report mode: bad:<cls>:<g>, orphan:<cls>:<g>;
-- recount_d:<g> (the group's delayed count moved)
local K_TALLY = prefix .. ':check:tally'
local K_SUSPECTS = prefix .. ':check:suspects'  -- SET groups whose counts disagreed
local K_UNLEASED = prefix .. ':check:unleased'  -- SET in-flight dispatch ids without lease
local K_NOTED = prefix .. ':check:groups'  -- SET groups met in messages and records
local K_OWNER = prefix .. ':check:token'   -- STRING token of the check in progress
local SCRATCH_TTL = 3600

local function finding(kind, subject, detail, action)
  out[#out + 1] = kind
  out[#out + 1] = subject
  out[#out + 1] = detail
  out[#out + 1] = repair and action or ''
end

local function read(n) out[2] = out[2] + n end

local function wrong_type(key, want)
  local t = redis.call('TYPE', key).ok
  return t ~= 'none' and t ~= want and t
end

-- A key of a type we never write blocks every script touching it: rename it aside.
local function foreign(key, want)
  local t = wrong_type(key, want)
  if not t then return false end
  local aside = prefix .. ':foreign:' .. string.sub(key, #prefix + 2) .. ':' .. now
  finding('foreign_key', key, 'is a ' .. t .. ', expected a ' .. want,
          'renamed to ' .. aside)
  if repair then redis.call('RENAME', key, aside) end
  return not repair
end

local function tally(field, delta) redis.call('HINCRBY', K_TALLY, field, delta) end
local function tallied(field) return tonumber(redis.call('HGET', K_TALLY, field) or '0') end

-- What g's class list holds, as the check counts it: without the ids found bad and with
-- the orphans of that group (both only tallied in report mode; repair fixes the list).
local function listed_count(cls, g)
  local orphans = tallied('orphan:' .. cls .. ':' .. g)
  if wrong_type(k_list(cls, g), 'list') then return orphans end  -- reported by the lists step
  return redis.call('LLEN', k_list(cls, g)) - tallied('bad:' .. cls .. ':' .. g) + orphans
         + SUBCAPS.held(cls, g)  -- parked (caps per subgroup): still held
end

-- Numbers a version before the range checks (limits.py, common.lua) could store: a NaN
-- or an infinity poisons every later tag, a huge cap breaks `fair limit`. A damaged
-- runtime limit or setting is dropped; what is in force goes back to the valid runtime
-- limit, else the valid setting, else the queue's default.
local function check_limits(what, settings, in_force, limits, valid)
  local touched = {}
  for _, k in ipairs({{limits, 'runtime ' .. what}, {settings, what .. ' setting'},
                      {in_force, what .. ' in force'}}) do
    local all = redis.call('HGETALL', k[1])
    for i = 1, #all, 2 do
      if not valid(all[i + 1]) then
        finding('bad_number', all[i], k[2] .. ' ' .. all[i + 1] .. ' in ' .. k[1] ..
                ' is out of range', 'dropped')
        touched[all[i]] = true
        if repair then redis.call('HDEL', k[1], all[i]) end
      end
    end
  end
  if not repair then return end
  for g in pairs(touched) do
    local value = redis.call('HGET', limits, g) or redis.call('HGET', settings, g)
    if value then redis.call('HSET', in_force, g, value) else redis.call('HDEL', in_force, g) end
  end
end

-- The queue's defaults (`conf`) and virtual times (`vt`).
local function check_queue_numbers()
  local function is_reserve(s) return (valid_cap(s) or -1) >= 0 end
  local function is_policy(v) return POLICIES[v] end
  for _, fv in ipairs({{'cap', valid_cap}, {'reserve', is_reserve}, {'weight', valid_weight},
                       {'rate', parse_rate}, {'policy', is_policy}, {'aging', valid_aging}}) do
    local field, valid = fv[1], fv[2]
    local value = redis.call('HGET', K_CONF, field)
    if value and not valid(value) then
      finding('bad_number', field, 'queue default ' .. field .. ' ' .. value .. ' in ' ..
              K_CONF .. ' is out of range', 'dropped (the default applies until a ' ..
              'dispatcher starts and writes the settings again)')
      if repair then redis.call('HDEL', K_CONF, field) end
    end
  end
  for _, cls in ipairs(CLASSES) do
    local vt = redis.call('HGET', K_VT, cls)
    if vt and not finite(vt) then
      local head = redis.call('ZRANGE', k_ready(cls), 0, 0, 'WITHSCORES')[2]
      local fixed_vt = finite(head) or 0
      finding('bad_number', cls, 'virtual time ' .. vt .. ' of class ' .. cls ..
              ' is not a finite number', 'set to ' .. fixed_vt .. ' (the lowest ready tag)')
      if repair then redis.call('HSET', K_VT, cls, fixed_vt) end
    end
  end
end

local function step_fixed()
  redis.call('DEL', K_SEEN, K_TALLY, K_SUSPECTS, K_UNLEASED, K_NOTED)
  local fixed = {{K_MSG, 'hash'}, {K_STAT, 'hash'}, {K_VT, 'hash'}, {K_CONF, 'hash'},
                 {K_CAPS, 'hash'}, {K_WEIGHTS, 'hash'}, {K_GROUPS, 'set'},
                 {K_DELAYED, 'zset'}, {K_LEASES, 'zset'}, {K_WAKE, 'list'},
                 {K_QUARANTINE, 'hash'}, {k_ready('i'), 'zset'}, {k_ready('b'), 'zset'},
                 {K_BACKLOG, 'zset'}, {K_CONF_CAPS, 'hash'}, {K_CONF_WEIGHTS, 'hash'},
                 {K_LIMIT_CAPS, 'hash'}, {K_LIMIT_WEIGHTS, 'hash'}, {K_RATES, 'hash'},
                 {K_CONF_RATES, 'hash'}, {K_LIMIT_RATES, 'hash'}, {K_THROTTLED, 'zset'},
                 {K_TATS, 'zset'}}
  local blocked = false
  for _, kt in ipairs(fixed) do
    if foreign(kt[1], kt[2]) then blocked = true end
  end
  if blocked then out[1] = 'blocked'; return end  -- report mode: the rest would fail on it
  check_queue_numbers()
  check_limits('cap', K_CONF_CAPS, K_CAPS, K_LIMIT_CAPS, valid_cap)
  check_limits('weight', K_CONF_WEIGHTS, K_WEIGHTS, K_LIMIT_WEIGHTS, valid_weight)
  check_limits('rate', K_CONF_RATES, K_RATES, K_LIMIT_RATES, valid_rate)
end

-- Up to `budget` ids of one group list, read from `offset` ids before its tail: a hold
-- appends at the tail and a pick pops at the head, so an id that stays listed is never
-- skipped (it may be read twice, which is harmless); one skipped all the same (a cancel
-- in the part read) is re-verified by the msg step before anything is said about it.
-- Returns how many ids it read and whether the list goes on beyond them.
local function check_list(g, cls, offset, budget)
  local key = k_list(cls, g)
  if foreign(key, 'list') then return 0, false end
  local ids = redis.call('LRANGE', key, -(offset + budget), -(offset + 1))
  local in_batch = {}
  for _, id in ipairs(ids) do
    local m = decode(redis.call('HGET', K_MSG, id) or '')
    if not m then
      finding('held_without_body', g, 'id ' .. id .. ' in ' .. key .. ' has no message',
              'removed from the list')
      if repair then unlist_held(cls, g, id) else tally('bad:' .. cls .. ':' .. g, 1) end
    elseif m.g ~= g or m.cls ~= cls or in_batch[id] or redis.call('ZSCORE', K_DELAYED, id) then
      finding('misplaced_id', g, 'id ' .. id .. ' in ' .. key .. ' belongs to group ' ..
              m.g .. ' class ' .. m.cls .. ' and is referred to more than once',
              'removed from the list')
      if repair then redis.call('LREM', key, -1, id) else tally('bad:' .. cls .. ':' .. g, 1) end
    else
      in_batch[id] = true
      redis.call('SADD', K_SEEN, id)
    end
  end
  return #ids, #ids == budget and redis.call('LLEN', key) > offset + budget
end

-- The lists of `names` (a JSON list of groups), both classes each, from `at` ("<group
-- index>,<class index>,<offset>", '' for the start), until `batch` entries are read (a
-- list visited counts as one): many small lists go in one call, a long one in several.
local function step_lists(names, at)
  local gs = cjson.decode(names)
  local i, c, offset = 1, 1, 0
  if at ~= '' then
    local a, b, o = string.match(at, '^(%d+),(%d+),(%d+)$')
    i, c, offset = tonumber(a), tonumber(b), tonumber(o)
  end
  local budget = batch
  while i <= #gs do
    if budget <= 0 then out[1] = i .. ',' .. c .. ',' .. offset; return end
    local n, more = check_list(gs[i], CLASSES[c], offset, budget)
    read(n + 1)
    budget = budget - n - 1
    if more then
      offset = offset + n
    else
      offset, c = 0, c + 1
      if c > #CLASSES then i, c = i + 1, 1 end
    end
  end
end

-- One ZSCAN/HSCAN call of about `batch` entries; the next cursor goes out as `next`.
local function scan_batch(key, cursor, is_hash)
  local got
  if is_hash then got = redis.call('HSCAN', key, cursor, 'COUNT', batch)
  else got = redis.call('ZSCAN', key, cursor, 'COUNT', batch) end
  if got[1] ~= '0' then out[1] = got[1] end
  read(#got[2] / 2)
  return got[2]
end

local function step_delayed(cursor)
  local entries = scan_batch(K_DELAYED, cursor)
  for i = 1, #entries, 2 do
    local id = entries[i]
    local m = decode(redis.call('HGET', K_MSG, id) or '')
    if not m then
      finding('delayed_without_body', id, 'in the delayed set but not in msg', 'removed')
      if repair then redis.call('ZREM', K_DELAYED, id) end
    else
      redis.call('SADD', K_SEEN, id)
      redis.call('SADD', K_NOTED, m.g)
      tally('d:' .. m.g, 1)
    end
  end
end

-- Is `id`, held for group m.g, in its list? Searched from the end its hold pushed it to,
-- where one held during the check is.
local function listed(id, m, v)
  local key = k_list(m.cls, m.g)
  if wrong_type(key, 'list') then return false end  -- a foreign key took its place
  return redis.call('LPOS', key, id, 'RANK', m.front and 1 or -1) ~= false
    or (redis.call('SCARD', SUBCAPS.parked) > 0  -- parked (caps per subgroup)
        and redis.call('LPOS', SUBCAPS.key(m.cls, m.g, subgroup_of(v)), id) ~= false)
end

local function step_msg(cursor)
  local entries = scan_batch(K_MSG, cursor, true)
  for i = 1, #entries, 2 do
    local id, v = entries[i], entries[i + 1]
    local m = decode(v)
    if m then redis.call('SADD', K_NOTED, m.g) end
    if not m then
      finding('corrupt_message', id, 'stored value cannot be decoded',
              'moved to ' .. K_QUARANTINE)
      if repair then quarantine(id, v, 'check: undecodable stored value') end
    elseif redis.call('SISMEMBER', K_SEEN, id) == 0 and not redis.call('ZSCORE', K_DELAYED, id)
        and not listed(id, m, v) and not singleton_waiting(id) then
      finding('orphan_message', id, 'held for group ' .. m.g .. ' but in no list',
              'held again in ' .. k_list(m.cls, m.g))
      if repair then  -- the counters still count it: only its list entry was lost
        push_held(m.cls, m.g, id, m.front, now)
        redis.call('SADD', K_GROUPS, m.g)
      else
        tally('orphan:' .. m.cls .. ':' .. m.g, 1)
      end
    end
  end
end

-- Dispatch records: every in-flight one (picked, queued, running) has a lease and counts
-- in its group's `n` and in `stat inflight`; finished ones (superseded, lost, released)
-- have none.
local active = {picked = true, queued = true, running = true}
local finished = {superseded = true, lost = true, released = true}

-- Check one record; returns its group when it is in flight.
local function check_dispatch(did, leased)
  local dk = k_dispatch(did)
  local state, g, v = unpack(redis.call('HMGET', dk, 's', 'g', 'v'))
  if active[state] and g then
    if not leased then
      finding('dispatch_without_lease', did, state .. ' dispatch of group ' .. g ..
              ' has no lease: its slot would never come back', 'lease added')
      if repair then redis.call('ZADD', K_LEASES, now + lease_ms, did) end
    end
    if state == 'picked' and not v then
      finding('picked_without_message', did, 'picked dispatch has lost its message bytes',
              'marked queued (its lease frees the slot if no worker has it)')
      if repair then redis.call('HSET', dk, 's', 'queued') end
    end
    redis.call('SADD', K_NOTED, g)
    return g
  elseif leased then
    -- a released dispatch's tombstone is its id in k_done (release.lua), not a record
    if not state and redis.call('HEXISTS', k_done(did), did) == 1 then state = 'released' end
    local what = state and (state .. ' dispatch') or 'no record'
    if state and not finished[state] then what = 'bad record (state ' .. state .. ')' end
    finding('lease_without_dispatch', did, 'lease on ' .. what, 'lease removed')
    if repair then redis.call('ZREM', K_LEASES, did) end
  end
end

local function step_dispatch(cursor, unleased)
  if cursor ~= '' then
    local entries = scan_batch(K_LEASES, cursor)
    for i = 1, #entries, 2 do
      local g = check_dispatch(entries[i], true)
      if g then tally('n:' .. g, 1); tally('inflight', 1) end
    end
    return
  end
  for _, did in ipairs(cjson.decode(unleased)) do
    read(1)
    if not redis.call('ZSCORE', K_LEASES, did) then
      local g = check_dispatch(did, false)
      if g then
        tally('n:' .. g, 1); tally('inflight', 1)
        redis.call('SADD', K_UNLEASED, did)
      end
    end
  end
end

-- A group's tags, damaged by an older version (a NaN weight): restarted at the virtual
-- time. Returns true when one was, so its ready sets need a refresh.
local function check_tags(g, gk)
  local stale = false
  for _, cls in ipairs(CLASSES) do
    local tag = redis.call('HGET', gk, 't' .. cls)
    if tag and not finite(tag) then
      finding('bad_number', g, 'tag t' .. cls .. ' ' .. tag .. ' is not a finite number',
              'restarted at the virtual time')
      if repair then redis.call('HDEL', gk, 't' .. cls) end
      stale = true
    end
  end
  return stale
end

-- Per group: counters, membership of `groups` and of the ready sets.
local function check_group(g, want_n, want_d)
  local gk = k_group(g)
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
  local held = listed_count('i', g) + listed_count('b', g)
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
  local stale = check_tags(g, gk)
  -- fair_scope 'app': another queue freed a slot of g, which the next promote here
  -- refreshes (SC.admit): its sets may not say so yet
  local marked = SC.app() and redis.call('SISMEMBER', SC.key('refresh:' .. SC.queue), g) == 1
  for _, cls in ipairs(CLASSES) do
    local score = redis.call('ZSCORE', k_ready(cls), g)
    local should = busy and eligible(cls, g, n_now)
    local tag = tonumber(redis.call('HGET', gk, 't' .. cls) or '0')
    if harmony() then tag = harmony_rank(g, SC.count(g, n_now)) end  -- the score is the rank
    -- fair_scope 'app': another queue's picks may have taken g to its cap, or moved its
    -- rank, since it was ranked here; the pick passes such a stale member over (SC.stale)
    local lazy = score and SC.app() and busy and redis.call('LLEN', k_list(cls, g)) > 0
    if should and not score and not marked then
      finding('not_ready', g, 'eligible for class ' .. cls .. ' but not in its ready set',
              'ready set refreshed')
      stale = true
    elseif score and not should and not lazy then
      finding('ready_but_ineligible', g, 'in the ready set of class ' .. cls ..
              ' but holds nothing there or is at its cap', 'ready set refreshed')
      stale = true
    elseif score and tonumber(score) ~= tag and not (lazy and harmony()) then
      finding('ready_tag_mismatch', g, 'ready score ' .. score .. ' differs from its tag or rank ' ..
              tag .. ' in class ' .. cls, 'ready set refreshed')
      stale = true
    end
    local over = redis.call('ZSCORE', k_over(cls), g)
    local stands_over = busy and standing(cls, g, n_now) == 'over'
    -- a stale ready member (lazy, above) stands over before it leaves the ready set
    local stale_over = lazy and stands_over and not over
    if (over ~= false) ~= stands_over and not (marked or stale_over) then
      finding('over_set_mismatch', g, 'its place in the over set of class ' .. cls ..
              ' differs from where it stands (soft caps)', 'over set refreshed')
      stale = true
    end
  end
  if repair and stale then refresh(g) end
end

-- A group's in-flight and delayed counts against the tallies of the dispatch and delayed
-- steps: equal, the group is checked now; else it is a suspect for `final` (work may
-- have started, ended or come due between the steps).
local function step_group(names)
  for _, g in ipairs(cjson.decode(names)) do
    read(1)
    local gk = k_group(g)
    local skip = foreign(gk, 'hash')
    for _, cls in ipairs(CLASSES) do  -- the lists step reported it
      if wrong_type(k_list(cls, g), 'list') then skip = true end
    end
    if not skip then
      local n = tonumber(redis.call('HGET', gk, 'n') or '0')
      local d = tonumber(redis.call('HGET', gk, 'd') or '0')
      local want_n, want_d = tallied('n:' .. g), tallied('d:' .. g)
      if n == want_n and d == want_d then check_group(g, want_n, want_d)
      else redis.call('SADD', K_SUSPECTS, g) end
      if d ~= want_d then tally('recount_d:' .. g, 1) end
    end
    for _, cls in ipairs(CLASSES) do tally('held:' .. cls, listed_count(cls, g)) end
  end
end

-- Exact in-flight counts per group (leases and the unleased records found), and the
-- exact delayed counts of `wanted` groups: one atomic read of each set.
local function recount(wanted)
  local n, d, total = {}, {}, 0
  local dids = redis.call('ZRANGE', K_LEASES, 0, -1)
  for _, did in ipairs(redis.call('SMEMBERS', K_UNLEASED)) do dids[#dids + 1] = did end
  for _, did in ipairs(dids) do
    local state, g = unpack(redis.call('HMGET', k_dispatch(did), 's', 'g'))
    if active[state] and g then
      n[g] = (n[g] or 0) + 1
      total = total + 1
    end
  end
  read(#dids)
  if next(wanted) then
    local delayed = redis.call('ZRANGE', K_DELAYED, 0, -1)
    read(#delayed)
    for _, id in ipairs(delayed) do
      local m = decode(redis.call('HGET', K_MSG, id) or '')
      if m and wanted[m.g] then d[m.g] = (d[m.g] or 0) + 1 end
    end
  end
  return n, d, total
end

local function check_totals(held_total, total)
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
    finding('queue_inflight', 'stat', 'inflight is ' .. inflight ..
            ', dispatch records say ' .. total, 'set to ' .. total)
    if repair then redis.call('HSET', K_STAT, 'inflight', total) end
  end
end

-- Suspects, checked on exact counts; then the totals, from the tallies when they agree,
-- else re-counted (the lists' lengths over every group: O(groups) O(1) reads).
-- Singleton keys: each owner of this queue must be a held message (listed, or to admit)
-- or a live dispatch, else the key's waiters would wait for ever; the repair passes the
-- key on. O(keys owned in the namespace: the owners are shared by its queues).
local function check_singletons()
  local owners = redis.call('HGETALL', K_SOWNER)
  read(#owners / 2)
  for i = 1, #owners, 2 do
    local key, owner = owners[i], owners[i + 1]
    local q, id = SG.unref(string.sub(owner, 2))
    local live = true  -- another queue's owner: that queue's check looks at it
    if q == SG.queue and string.sub(owner, 1, 1) == 'h' then
      live = redis.call('HEXISTS', K_MSG, id) == 1
    elseif q == SG.queue then
      live = active[redis.call('HGET', k_dispatch(id), 's') or ''] == true
    end
    if not live then
      finding('singleton_owner', key, 'owned by ' .. owner .. ', which is neither held ' ..
              'nor in flight', 'passed to its next waiting message')
      if repair then singleton_next(key, now) end
    end
  end
end

local function step_final()
  check_singletons()
  local suspects, wanted = redis.call('SMEMBERS', K_SUSPECTS), {}
  for _, g in ipairs(suspects) do  -- `delayed` is read only for a delayed count that moved
    if tallied('recount_d:' .. g) > 0 then wanted[g] = true end
  end
  local inflight = tonumber(redis.call('HGET', K_STAT, 'inflight') or '0')
  local total = tallied('inflight')
  local n, d
  if #suspects > 0 or inflight ~= total then n, d, total = recount(wanted) end
  for _, g in ipairs(suspects) do
    local d_g = d[g] or 0
    if not wanted[g] then  -- it agreed with the tally in the group step: as it is now
      d_g = tonumber(redis.call('HGET', k_group(g), 'd') or '0')
    end
    check_group(g, n[g] or 0, d_g)
  end
  local held_total = {i = tallied('held:i'), b = tallied('held:b')}
  local counted = {i = tonumber(redis.call('HGET', K_STAT, 'held:i') or '0'),
                   b = tonumber(redis.call('HGET', K_STAT, 'held:b') or '0')}
  if counted.i ~= held_total.i or counted.b ~= held_total.b then
    held_total = {i = 0, b = 0}
    local groups = redis.call('SUNION', K_GROUPS, K_NOTED)
    read(#groups)
    for _, g in ipairs(groups) do
      for _, cls in ipairs(CLASSES) do
        held_total[cls] = held_total[cls] + listed_count(cls, g)
      end
    end
  end
  check_totals(held_total, total)
  redis.call('DEL', K_SEEN, K_TALLY, K_SUSPECTS, K_UNLEASED, K_NOTED, K_OWNER)
end

if step == 'fixed' then
  redis.call('SET', K_OWNER, token, 'EX', SCRATCH_TTL)
  step_fixed()
elseif redis.call('GET', K_OWNER) ~= token then
  return redis.error_reply('ERR check: another check of this queue started since ' ..
                           '(one check at a time per queue)')
elseif step == 'lists' then step_lists(ARGV[7], ARGV[8])
elseif step == 'delayed' then step_delayed(ARGV[7])
elseif step == 'msg' then step_msg(ARGV[7])
elseif step == 'dispatch' then step_dispatch(ARGV[7], ARGV[8])
elseif step == 'group' then step_group(ARGV[7])
elseif step == 'final' then step_final()
else return redis.error_reply('ERR check: unknown step ' .. tostring(step)) end
if step ~= 'final' then
  for _, key in ipairs({K_SEEN, K_TALLY, K_SUSPECTS, K_UNLEASED, K_NOTED, K_OWNER}) do
    redis.call('EXPIRE', key, SCRATCH_TTL)
  end
end
if repair and #out > 2 then wake() end
out[2] = tostring(out[2])
return out
