-- Shared by every script (inserted where a script says `-- @include common`).
-- KEYS[1] is the fair queue's prefix "<ns>:{<queue>}"; every key below carries its hash
-- tag, so one script only ever touches one Redis Cluster slot. keys.py mirrors this layout.
local prefix = KEYS[1]
local K_MSG = prefix .. ':msg'          -- HASH hold id -> stored value (envelope.py)
local K_STAT = prefix .. ':stat'        -- HASH inflight, inflight:i, held:i, held:b, released, dup, skipped, picks, served, moves
local K_VT = prefix .. ':vt'            -- HASH class -> virtual time
local K_CONF = prefix .. ':conf'        -- HASH cap (-1: none), reserve, weight, rate (default), policy, charge, capmode, ishare, subgroup, scope, pathcaps
local K_CAPS = prefix .. ':caps'        -- HASH group -> cap in force (setting or limit)
local K_WEIGHTS = prefix .. ':weights'  -- HASH group -> weight in force
local K_CONF_CAPS = prefix .. ':conf:caps'          -- HASH group -> cap from the settings
local K_CONF_WEIGHTS = prefix .. ':conf:weights'    -- HASH group -> weight from the settings
local K_LIMIT_CAPS = prefix .. ':limit:caps'        -- HASH group -> runtime cap (limit.lua)
local K_LIMIT_WEIGHTS = prefix .. ':limit:weights'  -- HASH group -> runtime weight
local K_PAUSES = prefix .. ':pauses'    -- ZSET paused group ('': the queue) -> until (ms, inf)
local K_BOOSTS = prefix .. ':boosts'    -- HASH boosted group -> boost weight (boost.lua)
local K_BOOSTS_UNTIL = prefix .. ':boosts:until'  -- ZSET boosted group -> until (ms, inf)
local K_RATES = prefix .. ':rates'      -- HASH group -> rate in force ('<interval ms>:<burst>', 'none')
local K_CONF_RATES = prefix .. ':conf:rates'    -- HASH group -> rate from the settings
local K_LIMIT_RATES = prefix .. ':limit:rates'  -- HASH group -> runtime rate (rate.lua)
local K_THROTTLED = prefix .. ':throttled'  -- ZSET throttled group -> until (ms): its rate, a task
local K_TATS = prefix .. ':tats'        -- ZSET rate-limited group -> theoretical arrival time (ms)
local K_BACKLOG = prefix .. ':backlog'  -- ZSET group -> held messages (both classes)
local K_GROUPS = prefix .. ':groups'    -- SET groups with held, delayed or in-flight work
local K_DELAYED = prefix .. ':delayed'  -- ZSET hold id -> due time (ms)
local K_LEASES = prefix .. ':leases'    -- ZSET dispatch id -> lease deadline (ms)
local K_WAKE = prefix .. ':wake'        -- LIST of at most one marker: dispatchers BLPOP it
-- Refill in release (DESIGN.md): pick.lua writes `params` (HASH, with an expiry: the
-- dispatcher's capacity, leases, id prefix and direct push) and drains `told` (LIST of the
-- messages release.lua pushed, 5 fields each) and `handed` (LIST of dispatch ids it took
-- but could not push); release.lua reads the one and appends to the others. One table:
-- check.lua is near Lua's 200 locals.
local RF = {params = prefix .. ':refill', told = prefix .. ':refilled',
            handed = prefix .. ':handoff'}
local K_QUARANTINE = prefix .. ':quarantine'  -- HASH id -> value that cannot be decoded
local K_QUARANTINE_ORDER = prefix .. ':quarantine:order'  -- LIST its ids, newest first
local K_WORKERS = prefix .. ':workers'  -- HASH worker -> '<expires ms>:<pool>' (register.lua)
local K_WMETA = prefix .. ':wmeta'      -- HASH worker -> '<started ms>:<slot>' (register.lua)
local K_AFF = prefix .. ':aff'          -- HASH group -> worker its tasks go to (fair_affinity; assign.lua)
-- caps per subgroup (include/subcaps.lua has the functions): one local, as pick.lua is
-- near Lua's 200
local SUBCAPS = {
  flight = prefix .. ':sgflight',  -- HASH "<group>/<subgroup>" -> its dispatches in flight (record field `sg`)
  parked = prefix .. ':parked',    -- SET "<class>:<group>/<subgroup>" of the parked lists that hold ids
}
local K_WFLIGHT = prefix .. ':wflight'  -- HASH worker -> its routed dispatches in flight (record field `w`)

local CLASSES = {'i', 'b'}               -- interactive first

local function k_list(cls, g) return prefix .. ':q:' .. cls .. ':' .. g end
-- smallest: ZSET hold id -> sort key of the ids its hold placed in order (push_held)
local function k_keys(cls, g) return prefix .. ':qk:' .. cls .. ':' .. g end
-- fair_subgroup 'path': HASH subgroup -> the key its last hold got in g's class list
-- (subgroup_key; '': the tasks without a subgroup), and SUB_VT -> the key of the last one
-- picked (the list's virtual time)
local function k_subtags(cls, g) return prefix .. ':sg:' .. cls .. ':' .. g end
local function k_group(g) return prefix .. ':g:' .. g end
local function k_ready(cls) return prefix .. ':ready:' .. cls end
-- soft caps: the groups at or over their cap with work held, picked only when no group
-- is ready (scored as the ready sets are)
local function k_over(cls) return prefix .. ':over:' .. cls end
local function k_dispatch(did) return prefix .. ':d:' .. did end
-- SET of the copies of task id <id> held under <id>~<suffix> (hold.lua; reclaim.lua adds
-- ~<dispatch id>, to a copy too), so cancel finds them in O(copies), not O(held): the
-- index of the copy `id` (or of the task id `id`) is its root's, the part before a '~'.
-- Only an id held twice has one; it goes with its last copy.
local function k_copies(id) return prefix .. ':copies:' .. (string.match(id, '^([^~]*)~') or id) end
-- HASH hold id -> value of what the cancel call <token> removed, kept a while so that the
-- call resent (its reply lost) still hands them back.
local function k_cancelled(token) return prefix .. ':cancelled:' .. token end
-- STRING: what the publication held under task id <id> last was (hold.lua): the sha1 of
-- its stored value but for the hold time (the meta's "t") and the hold id it got, kept
-- a while so that the same message published again (the caller was told the outcome was
-- unknown or not replicated) is held once, even after the first was picked or has run.
local function k_sent(id) return prefix .. ':sent:' .. id end
-- Tombstones of dispatches that ran to their end (release.lua, begin.lua skips a copy):
-- HASH dispatch id -> ''. A dispatch id is <token><call>.<n> with <call> counted per
-- queue, so the ids of 8 consecutive pick calls, 16 per call, share one small hash that
-- Redis keeps as a listpack: ~30 bytes a tombstone rather than ~180 for a key of its own.
local function k_done(did)
  local call, n = string.match(did, '(%d+)%.(%d+)$')
  if not call then return prefix .. ':done:-' end  -- not an id pick.lua made
  return prefix .. ':done:' .. math.floor(tonumber(call) / 8) .. '.' ..
    math.floor(tonumber(n) / 16)
end

-- The stored value's prefix: <class><front><cost>:<glen>:<group> (see envelope.py).
local function parse(v)
  local cls = string.sub(v, 1, 1)
  local front = string.sub(v, 2, 2) == '1'
  local p1 = string.find(v, ':', 3, true)
  local cost = tonumber(string.sub(v, 3, p1 - 1))
  local p2 = string.find(v, ':', p1 + 1, true)
  local glen = tonumber(string.sub(v, p1 + 1, p2 - 1))
  return cls, front, cost, string.sub(v, p2 + 1, p2 + glen)
end

-- Bounds of a stored cap (-1: none) and weight; limits.py has the same. A NaN or an
-- infinity stored once (a version before these checks) would poison every later tag, so
-- scripts refuse to write one and read a damaged one as absent; `check` reports it.
local MAX_CAP, MIN_WEIGHT, MAX_WEIGHT, MAX_COST = 1000000, 1e-6, 1e6, 1e9
-- Rates (limits.py): an interval from 1000 / MAX_RATE to a day, a burst from 1 to MAX_BURST;
-- the meter (pick.lua) counts a token from its TAT or RATE_EARLY_MS before now (models.py).
local MIN_INTERVAL, MAX_INTERVAL, MAX_BURST, RATE_EARLY_MS = 1000 / 1e6, 86400000, 1000000, 20

-- The number `s` when it is a cap: an integer from -1 to MAX_CAP; else nil.
local function valid_cap(s)
  local n = tonumber(s)
  if n and n == math.floor(n) and n >= -1 and n <= MAX_CAP then return n end
end

-- The number `s` when it is a weight: finite, from MIN_WEIGHT to MAX_WEIGHT; else nil.
local function valid_weight(s)
  local n = tonumber(s)
  if n and n >= MIN_WEIGHT and n <= MAX_WEIGHT then return n end  -- NaN fails both
end

-- The number `s` when it is finite (a virtual time or tag); else nil.
local function finite(s)
  local n = tonumber(s)
  if n and n == n and n > -math.huge and n < math.huge then return n end
end

-- The interval (ms) and burst of a stored rate ('<interval>:<burst>'); nil for 'none',
-- nothing, or a damaged one (`check` reports that).
local function parse_rate(s)
  if not s then return nil end
  local a, b = string.match(s, '^([^:]+):(%d+)$')
  local interval, burst = tonumber(a), tonumber(b)
  if interval and burst and interval >= MIN_INTERVAL and interval <= MAX_INTERVAL
     and burst >= 1 and burst <= MAX_BURST then
    return interval, burst
  end
end

local function valid_rate(s)
  return s == 'none' or parse_rate(s) ~= nil
end

-- A group's rate in force: its own (settings with the runtime limits laid over them, in
-- `rates`), else the queue's default (conf `rate`; passed when read already).
local function rate_of(g, default_rate)
  local s = redis.call('HGET', K_RATES, g)
  if not s then
    if default_rate == nil then default_rate = redis.call('HGET', K_CONF, 'rate') end
    s = default_rate
  end
  return parse_rate(s)
end

-- g's rate in force was `interval`/`burst` (nil: none) before a change of rates
-- (rate.lua, configure.lua). When the rate in force changed, g's bucket starts full (its
-- TAT goes) and the throttle its old rate gave it goes; a task's (fair_throttle) that ends
-- later stays. True when a throttle was lifted: the caller refreshes g. Policy `_rerate`.
local function rerate(g, interval, burst)
  local now_interval, now_burst = rate_of(g)
  if now_interval == interval and now_burst == burst then return false end
  local tat = tonumber(redis.call('ZSCORE', K_TATS, g))
  redis.call('ZREM', K_TATS, g)
  local ends = tonumber(redis.call('ZSCORE', K_THROTTLED, g))
  if not (ends and tat and interval) or ends > tat - (burst - 1) * interval then
    return false  -- none, or a task's
  end
  redis.call('ZREM', K_THROTTLED, g)
  return true
end

-- A group's cap (-1: none) and weight in force. `caps`/`weights` hold the settings with
-- the runtime limits already laid over them (configure.lua, limit.lua): one read each.
-- `default_cap`, the queue's (conf `cap`), is passed by a script that read it already
-- (pick: once per call, not per message); without it, it is read here.
local function cap_of(g, default_cap)
  return valid_cap(redis.call('HGET', K_CAPS, g)) or default_cap
         or valid_cap(redis.call('HGET', K_CONF, 'cap')) or -1
end

local function weight_of(g, default)
  return valid_weight(redis.call('HGET', K_WEIGHTS, g)) or default
end

-- The weight the pick uses: a boost (boost.lua), kept apart from the weights, wins while
-- it lasts (policy `pick_weight`).
local function pick_weight_of(g, default)
  return valid_weight(redis.call('HGET', K_BOOSTS, g)) or weight_of(g, default)
end

-- The policy (conf `policy`, limits.py POLICIES): read once per script call, as every
-- refresh asks; configure.lua sets it and forgets what was read.
local POLICIES = {wfq = true, harmony = true, smallest = true}
-- With it, in the same call, fair_subgroup (conf `subgroup`): 'path' keeps each group's
-- class lists in subgroup key order (subgroup_key). Never with smallest (policies.py
-- refuses both). A script that read conf already sets both before asking.
-- And fair_scope (conf `scope`: SC.read, below), so that a hold reads conf once.
local policy_read, subgroup_read = nil, nil
local SC = {read = nil}
local function read_policy()
  if policy_read == nil or subgroup_read == nil or SC.read == nil then
    local policy, subgroup, scope = unpack(redis.call('HMGET', K_CONF, 'policy', 'subgroup', 'scope'))
    if policy_read == nil then policy_read = policy or 'wfq' end
    if subgroup_read == nil then subgroup_read = subgroup == 'path' end
    if SC.read == nil then SC.read = scope == 'app' end
  end
end
local function harmony()
  if policy_read == nil then read_policy() end
  return policy_read == 'harmony'
end
-- smallest: groups go as under wfq, and inside a group's class list the held message
-- with the lowest sort key goes first (push_held)
local function smallest()
  harmony()
  return policy_read == 'smallest'
end

local function subgroups()
  if subgroup_read == nil then read_policy() end
  return subgroup_read
end
local SUB_VT = '\n'  -- no subgroup name has a control character (names.py)

-- fair_aging_seconds (conf `aging`, limits.py DEFAULT_AGING, MAX_AGING): read once per
-- script call, as the policy is; configure.lua sets it and forgets what was read.
local DEFAULT_AGING, MAX_AGING = 1, 31536000
local function valid_aging(s)
  local n = tonumber(s)
  if n and n >= 0 and n <= MAX_AGING then return n end  -- NaN fails both
end
local aging_read = nil
local function aging()
  if aging_read == nil then
    aging_read = valid_aging(redis.call('HGET', K_CONF, 'aging')) or DEFAULT_AGING
  end
  return aging_read
end

-- The cap mode (conf `capmode`, limits.py CAP_MODES), read once per script call as the
-- policy is; configure.lua sets it and forgets what was read.
local soft_read = nil
local function soft_caps()
  if soft_read == nil then soft_read = redis.call('HGET', K_CONF, 'capmode') == 'soft' end
  return soft_read
end

-- What a dispatch charges a group under wfq (conf `charge`, limits.py CHARGES; absent:
-- 'cost', as before the setting): its cost, 1 per task, or the wall time it ran ('runtime':
-- its cost is the estimate, corrected at release). MAX_RUNTIME: limits.py's, in seconds.
local CHARGES = {cost = true, count = true, runtime = true}
local MAX_RUNTIME, RUNTIME_SMOOTHING = 31536000, 8

-- A group's place in the ready sets under Harmony (decisions.py `harmony_rank`): its
-- in-flight count per unit of weight in whole numbers, then the pick sequence when it
-- was last served (group field `s`; 0: never) over SERVED_SPAN; a rank boost_task.lua
-- set (`j`) instead, until the group's next pick.
local SERVED_SPAN = 4294967296
local function harmony_rank(g, n)
  local gk = k_group(g)
  local jump = finite(redis.call('HGET', gk, 'j'))
  if jump then return jump end
  local w = pick_weight_of(g, valid_weight(redis.call('HGET', K_CONF, 'weight')) or 1)
  local served = tonumber(redis.call('HGET', gk, 's') or '0') or 0
  return math.floor(n / w) + (served % SERVED_SPAN) / SERVED_SPAN
end

-- Count `delta` messages entering (+) or leaving (-) g's class `cls` list: the per-class
-- totals in `stat` and the backlog ranking read by metrics and `fair groups`, in O(log G).
local function rank_backlog(g, delta)
  if redis.call('ZINCRBY', K_BACKLOG, delta, g) + 0 <= 0 then redis.call('ZREM', K_BACKLOG, g) end
end

-- The parsed prefix of a stored value, or nil when it is not one we wrote.
local function decode(v)
  local ok, cls, front, cost, g = pcall(parse, v)
  if ok and (cls == 'i' or cls == 'b') and cost and cost > 0 and cost <= MAX_COST
     and g and #g > 0 then
    return {cls = cls, front = front, cost = cost, g = g}
  end
end

-- The subgroup a stored value names (its meta's `sg`: envelope.py), '' for none.
local function subgroup_of(v)
  local ok, sg = pcall(function()
    local p1 = string.find(v, ':', 3, true)
    local p2 = string.find(v, ':', p1 + 1, true)
    local start = p2 + tonumber(string.sub(v, p1 + 1, p2 - 1)) + 1
    return cjson.decode(string.sub(v, start, string.find(v, '\n', start, true) - 1)).sg
  end)
  if ok and type(sg) == 'string' then return sg end
  return ''
end

-- fair_subgroup 'path': the key of a message of cost `cost` held now in g's class list
-- (decisions.py `subgroup_key`): self-clocked fair queueing among the subgroups, the
-- later of the list's virtual time (the key last picked) and the key the subgroup's
-- previous hold got, plus cost / the subgroup's weight (`weights` "<g>/<subgroup>", else
-- 1). So a subgroup that floods gets keys far ahead, one that arrives starts at the
-- virtual time, and they alternate. An empty list starts afresh (its keys all left).
local function subgroup_key(cls, g, cost, v)
  local tags = k_subtags(cls, g)
  if redis.call('LLEN', k_list(cls, g)) == 0 then redis.call('DEL', tags) end
  local sg = subgroup_of(v)
  local vt, last = unpack(redis.call('HMGET', tags, SUB_VT, sg))
  local w = sg ~= '' and valid_weight(redis.call('HGET', K_WEIGHTS, g .. '/' .. sg)) or 1
  local key = math.max(tonumber(vt) or 0, tonumber(last) or 0) + cost / w
  redis.call('HSET', tags, sg, string.format('%.17g', key))
  return key
end

-- smallest: put hold id `id` into g's class list at its place by sort key (decisions.py
-- `smallest_key`: when it became held, in ms, plus its cost times the aging in ms: a
-- task of cost c ranks as if it had come c * aging seconds later). The keys of the ids
-- placed so are kept in k_keys (ZSET, ties by hold id), so the place is before the next
-- one in that order (ZRANK, then LINSERT: O(list) in C), else at the tail. Ids the
-- index does not know (held under another policy, or at the front) stay where they are:
-- before every keyed one. An index entry whose id left the list some way that did not
-- drop it is dropped when met. Returns the list's length.
-- Under fair_subgroup 'path' the key is subgroup_key's instead.
local function insert_held(cls, g, id, now)
  local list, index = k_list(cls, g), k_keys(cls, g)
  local v = redis.call('HGET', K_MSG, id) or ''
  local m = decode(v)
  local key
  if smallest() then
    key = tonumber(now) + (m and m.cost or 1) * aging() * 1000
  else
    key = subgroup_key(cls, g, m and m.cost or 1, v)
  end
  redis.call('ZADD', index, string.format('%.17g', key), id)
  local rank = redis.call('ZRANK', index, id)
  while true do
    local after = redis.call('ZRANGE', index, rank + 1, rank + 1)[1]
    if not after then break end
    local was_head = redis.call('LINDEX', list, 0) == after
    local len = redis.call('LINSERT', list, 'BEFORE', after, id)
    if len > 0 then
      if was_head then redis.call('HSET', k_group(g), 'h' .. cls, now) end
      return len
    end
    redis.call('ZREM', index, after)  -- stale: its id is not in the list
  end
  local len = redis.call('RPUSH', list, id)
  if len == 1 then redis.call('HSET', k_group(g), 'h' .. cls, now) end
  return len
end

-- Put hold id `id` in group g's list of class cls (at its head when `front`, a retry;
-- under smallest anything else at its place by sort key: insert_held);
-- a message that becomes the head (to the front, or into an empty list) stamps the
-- group's head time of that class (`h<class>`) with `now`, the time its wait counts from.
-- Returns the list's length.
local function push_held(cls, g, id, front, now)
  if not front and (smallest() or subgroups()) then return insert_held(cls, g, id, now) end
  local len
  if front then
    len = redis.call('LPUSH', k_list(cls, g), id)
  else
    len = redis.call('RPUSH', k_list(cls, g), id)
  end
  if front or len == 1 then redis.call('HSET', k_group(g), 'h' .. cls, now) end
  return len
end

-- The head of g's class list taken off (pick), out of the smallest index too; under
-- fair_subgroup 'path' its key is the list's virtual time now (the subgroup tags go
-- with the list's last id).
local function pop_held(cls, g)
  local id = redis.call('LPOP', k_list(cls, g))
  if id and smallest() then redis.call('ZREM', k_keys(cls, g), id) end
  if id and not smallest() and subgroups() then
    local index, tags = k_keys(cls, g), k_subtags(cls, g)
    local key = redis.call('ZSCORE', index, id)
    redis.call('ZREM', index, id)
    if redis.call('LLEN', k_list(cls, g)) == 0 then
      redis.call('DEL', tags)
    elseif key then
      redis.call('HSET', tags, SUB_VT, key)
    end
  end
  return id
end

-- Hold id `id` taken out of g's class list (cancel, boost_task, check): out of the
-- sort-key index too, and the list empty, its subgroup tags go (no tag outlives what is
-- held: a forgotten group's would be left behind). Returns 1 when it was listed.
local function unlist_held(cls, g, id)
  redis.call('ZREM', k_keys(cls, g), id)
  local listed = redis.call('LREM', k_list(cls, g), 1, id)
  if redis.call('LLEN', k_list(cls, g)) == 0 then redis.call('DEL', k_subtags(cls, g)) end
  return listed
end

local function count_held(cls, g, delta)
  redis.call('HINCRBY', K_STAT, 'held:' .. cls, delta)
  rank_backlog(g, delta)
end

-- A copy (<id>~<suffix>) held, and no longer held: in its task id's index, or out of it.
local function index_copy(id)
  if string.find(id, '~', 1, true) then redis.call('SADD', k_copies(id), id) end
end
local function unindex_copy(id)
  if string.find(id, '~', 1, true) then redis.call('SREM', k_copies(id), id) end
end
-- Keep an undecodable held message aside (never dropped) so it blocks nothing else. The
-- order list lets the store keep the newest ones only (RedisStore trims it, and logs).
local function quarantine(id, v, why)
  redis.call('HSET', K_QUARANTINE, id, v)
  redis.call('HSET', K_QUARANTINE .. ':why', id, why)
  redis.call('LREM', K_QUARANTINE_ORDER, 1, id)
  redis.call('LPUSH', K_QUARANTINE_ORDER, id)
  redis.call('HDEL', K_MSG, id)
  unindex_copy(id)
end

local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('LPUSH', K_WAKE, '1') end
end

-- fair_scope (conf `scope`, limits.py SCOPES; DESIGN.md "Tenant scope"): 'app' counts a
-- group's dispatches in flight over every fair queue of the namespace whose scope is
-- 'app' (HASH `<ns>:scope:n` group -> count, beside each queue's own `n`), and its cap
-- binds that count. One table (pick.lua is near Lua's 200 locals). Read once per call,
-- with the policy (read_policy); configure.lua sets it and forgets what was read. Never
-- on Redis Cluster (redis_policy.py refuses it: a script reaches one slot).
SC.ns, SC.queue = string.match(prefix, '^(.-):{(.*)}$')
function SC.app()
  if SC.read == nil then read_policy() end
  return SC.read
end
function SC.key(what) return SC.ns .. ':scope:' .. what end  -- n, queues, refresh:<queue>
-- The in-flight count g's cap binds: the queue's own `n`, or the app's.
function SC.count(g, n)
  if not SC.app() then return n end
  return tonumber(redis.call('HGET', SC.key('n'), g) or '0')
end
-- g's app-wide count moves by `delta` (nothing under scope 'queue'). Returns it, or nil.
function SC.add(g, delta)
  if not SC.app() then return nil end
  local total = redis.call('HINCRBY', SC.key('n'), g, delta)
  if total <= 0 then redis.call('HDEL', SC.key('n'), g) end
  return total
end
-- A slot of g came back app-wide: every other app-scoped queue that knows g refreshes it
-- at its next promote (SC.admit; a script cannot refresh another queue's sets: its key
-- names are bound to this queue) and its dispatchers are woken, as a singleton hand-over.
function SC.freed(g)
  for _, q in ipairs(redis.call('SMEMBERS', SC.key('queues'))) do
    if q ~= SC.queue and redis.call('SISMEMBER', SC.ns .. ':{' .. q .. '}:groups', g) == 1 then
      redis.call('SADD', SC.key('refresh:' .. q), g)
      local marker = SC.ns .. ':{' .. q .. '}:wake'  -- wake(), for that queue
      if redis.call('LLEN', marker) == 0 then redis.call('LPUSH', marker, '1') end
    end
  end
end

local function inflight_of(g)
  return tonumber(redis.call('HGET', k_group(g), 'n') or '0')
end

-- Where a group stands in a class: 'ready' while it holds work there and is under its
-- cap (interactive work may also use the reserve above the cap); under soft caps 'over'
-- while it holds work at or over its cap (not paused, throttled or capped at 0); else
-- nil. `default_cap`: see cap_of. Policy `decisions.standing`.
local function standing(cls, g, n, default_cap)
  n = SC.count(g, n)  -- fair_scope 'app': the app's count
  if redis.call('LLEN', k_list(cls, g)) == 0 then return nil end
  if redis.call('ZSCORE', K_PAUSES, g) then return nil end  -- paused (pause.lua): any class
  if redis.call('ZSCORE', K_THROTTLED, g) then return nil end  -- its rate, or a task's throttle
  local cap = cap_of(g, default_cap)
  if cap < 0 then return 'ready' end
  -- cap 0 pauses the group (`fair limit`): the reserve is room above a cap for
  -- interactive work, not a way past a pause, and neither is a soft cap
  if cap == 0 then return nil end
  if cls == 'i' then cap = cap + (valid_cap(redis.call('HGET', K_CONF, 'reserve')) or 0) end
  if n < cap then return 'ready' end
  if soft_caps() then return 'over' end
  return nil
end

local function eligible(cls, g, n, default_cap)
  return standing(cls, g, n, default_cap) == 'ready'
end

-- Make g's membership of each ready set (and under soft caps each over set) match where
-- it stands (standing's decisions). A group entering a set starts at the class's virtual
-- time: no credit for having been idle; one in a set of the class (ready or over) keeps
-- its tag (only a release's correction takes it below: policy `entry_tag`). Under Harmony
-- its score is its rank, in both classes.
-- Returns true when g entered a set it was not in. `default_cap`: see cap_of.
-- `known` (optional): what the caller read in this call already and has not changed
-- since, so it is not read again: `n` (in flight), `cap` (cap_of), `len_<class>` (the
-- list's length), `vt_<class>` (the virtual time, as stored), `in_<class>` (g's score
-- in that ready set, as stored; false: not in it). The decisions are standing's, each
-- class's once, the group's pause, throttle and cap read once for both classes.
local function refresh(g, default_cap, known)
  known = known or {}
  local gk = k_group(g)
  local n = SC.count(g, known.n or inflight_of(g))  -- fair_scope 'app': the app's count
  local entered, rank, blocked, cap, reserve = false, nil, nil, known.cap, nil
  local soft = soft_caps()  -- else the over sets are empty (configure.lua empties them)
  local function where_of(cls)  -- standing(cls, g, n, default_cap)
    if (known['len_' .. cls] or redis.call('LLEN', k_list(cls, g))) == 0 then return nil end
    if blocked == nil then  -- paused (pause.lua), or its rate's or a task's throttle
      blocked = (redis.call('ZSCORE', K_PAUSES, g) or redis.call('ZSCORE', K_THROTTLED, g))
                and true or false
    end
    if blocked then return nil end
    if cap == nil then cap = cap_of(g, default_cap) end
    if cap < 0 then return 'ready' end
    if cap == 0 then return nil end  -- a pause: neither the reserve nor a soft cap passes it
    local room = cap
    if cls == 'i' then
      if reserve == nil then reserve = valid_cap(redis.call('HGET', K_CONF, 'reserve')) or 0 end
      room = cap + reserve
    end
    if n < room then return 'ready' end
    if soft then return 'over' end
    return nil
  end
  for _, cls in ipairs(CLASSES) do
    local member = known['in_' .. cls]
    if member then member = tonumber(member) end
    local where = where_of(cls)
    if where then
      local score
      if harmony() then
        rank = rank or string.format('%.17g', harmony_rank(g, n))  -- in full, as for tags
        score = rank
      else
        if SC.app() and not (member or (member == nil and redis.call('ZSCORE', k_ready(cls), g))
            or (soft and redis.call('ZSCORE', k_over(cls), g))) then
          SC.entered(cls, g)  -- wfq shares across queues: nothing owed from before
        end
        score = finite(redis.call('HGET', gk, 't' .. cls) or '0')
        local vt = known['vt_' .. cls]
        if vt == nil then vt = redis.call('HGET', K_VT, cls) end
        vt = finite(vt or '0') or 0
        -- entering behind the virtual time, or a damaged tag: at the virtual time (a
        -- member of the class's ready or over set keeps its tag, below it after a
        -- release's correction: `entry_tag`)
        if not score or (vt > score and not (member or (member == nil
            and redis.call('ZSCORE', k_ready(cls), g))
            or (soft and redis.call('ZSCORE', k_over(cls), g)))) then
          score = vt
          redis.call('HSET', gk, 't' .. cls, score)
        end
      end
      if where == 'ready' then
        -- known to be there at this very score: ZADD would change nothing
        if member ~= tonumber(score) and redis.call('ZADD', k_ready(cls), score, g) == 1 then
          entered = true
        end
        if soft then redis.call('ZREM', k_over(cls), g) end
      else  -- over its cap under soft caps
        if member ~= false then redis.call('ZREM', k_ready(cls), g) end
        if redis.call('ZADD', k_over(cls), score, g) == 1 then entered = true end
      end
    else
      if member ~= false then redis.call('ZREM', k_ready(cls), g) end
      if soft then redis.call('ZREM', k_over(cls), g) end
    end
  end
  return entered
end

-- Forget a group that holds nothing, waits for nothing and runs nothing. `n`: its
-- in-flight count when the caller has it.
local function forget_if_idle(g, n)
  local gk = k_group(g)
  local delayed, parked = unpack(redis.call('HMGET', gk, 'd', 'pk'))
  if (n or inflight_of(g)) > 0 or tonumber(delayed or '0') > 0
     or tonumber(parked or '0') > 0 then return end
  for _, cls in ipairs(CLASSES) do
    if redis.call('LLEN', k_list(cls, g)) > 0 then return end
  end
  redis.call('DEL', gk)
  redis.call('SREM', K_GROUPS, g)
  SC.forgot(g)
end

-- Promote: the groups another app-scoped queue freed a slot of (SC.freed) are
-- refreshed here, so one that was at its cap app-wide goes again without a poll.
function SC.admit()
  if not SC.app() then return end
  local k = SC.key('refresh:' .. SC.queue)
  for _, g in ipairs(redis.call('SMEMBERS', k)) do
    if redis.call('SISMEMBER', K_GROUPS, g) == 1 then refresh(g) end
  end
  redis.call('DEL', k)
end

-- The pick's head g of class `cls` (cap `cap` in force) may be stale under scope 'app':
-- another queue's picks raised g's count to its cap after g was ranked here. True when
-- g, in the ready set, may not go: the pick refreshes it (out of the set) and looks again.
-- wfq shares across the app-scoped queues (policy/scope.py): `<ns>:scope:charge`,
-- HASH '<class>:<group>' -> the tag advances charged to the group over those queues;
-- the group's `x<class>` here is that total when this queue last took it into its tag.
local function full(x) return string.format('%.17g', x) end
function SC.charged(cls, g, advance)  -- this queue moved g's tag by `advance`
  if not SC.app() then return end
  local ck, field, gk = SC.key('charge'), cls .. ':' .. g, k_group(g)
  redis.call('HSET', ck, field, full((finite(redis.call('HGET', ck, field)) or 0) + advance))
  redis.call('HSET', gk, 'x' .. cls,
             full((finite(redis.call('HGET', gk, 'x' .. cls)) or 0) + advance))
end
-- The pick's head: what other queues charged g since this one last looked (once per
-- group and class per pick, `synced`), now taken as seen; nil when nothing.
function SC.behind(cls, g, synced)
  local field = cls .. ':' .. g
  if not SC.app() or harmony() or synced[field] then return nil end
  synced[field] = true
  local total = finite(redis.call('HGET', SC.key('charge'), field)) or 0
  local behind = total - (finite(redis.call('HGET', k_group(g), 'x' .. cls)) or 0)
  if behind <= 0 then return nil end
  redis.call('HSET', k_group(g), 'x' .. cls, full(total))
  return behind
end
-- g enters a set of class `cls` from outside both: what other queues charged it while
-- it was out is forgiven, as idle time is.
function SC.entered(cls, g)
  local total = finite(redis.call('HGET', SC.key('charge'), cls .. ':' .. g)) or 0
  redis.call('HSET', k_group(g), 'x' .. cls, full(total))
end
-- This queue forgot g: when no app-scoped queue knows it any more, its totals go
-- (whoever meets it next syncs from 0 as it enters a set).
function SC.forgot(g)
  if not SC.app() then return end
  for _, q in ipairs(redis.call('SMEMBERS', SC.key('queues'))) do
    if q ~= SC.queue and redis.call('SISMEMBER', SC.ns .. ':{' .. q .. '}:groups', g) == 1 then
      return
    end
  end
  redis.call('HDEL', SC.key('charge'), 'i:' .. g, 'b:' .. g)
end

function SC.stale(cls, g, cap)
  if not SC.app() or cap < 0 or not redis.call('ZSCORE', prefix .. ':ready:' .. cls, g) then
    return false
  end
  if cls == 'i' and cap > 0 then
    cap = cap + (valid_cap(redis.call('HGET', K_CONF, 'reserve')) or 0)
  end
  return SC.count(g, 0) >= cap
end

-- One slot of g comes back (release, reclaim) from a dispatch of class `cls`. `only`:
-- nothing else of g changed in this call (release): then under wfq the slot changes g's
-- standing only when it brings g back under its cap (interactive: cap and reserve):
-- that is also the one step that moves it from an over set (soft caps) to a ready set,
-- and a member of either keeps its tag, so otherwise its sets are left as they are (a
-- refresh would find them right); under Harmony its rank moved, so it is refreshed.
-- Only a group with nothing left in flight may be idle.
local function free_slot(g, cls, only)
  local n = redis.call('HINCRBY', k_group(g), 'n', -1)
  redis.call('HINCRBY', K_STAT, 'inflight', -1)
  if cls == 'i' then redis.call('HINCRBY', K_STAT, 'inflight:i', -1) end
  local cap, conf = nil, nil
  if only then  -- what the decision and a refresh read of conf, in one call
    conf = redis.call('HMGET', K_CONF, 'policy', 'cap', 'reserve', 'capmode', 'subgroup', 'scope')
    if SC.read == nil then SC.read = conf[6] == 'app' end
  end
  local total = SC.add(g, -1)  -- fair_scope 'app': the app's count, which the cap binds
  if only then
    local policy, conf_cap, reserve, capmode, subgroup = unpack(conf)
    if policy_read == nil then policy_read = policy or 'wfq' end
    if subgroup_read == nil then subgroup_read = subgroup == 'path' end
    if soft_read == nil then soft_read = capmode == 'soft' end
    if not harmony() then
      cap = valid_cap(redis.call('HGET', K_CAPS, g)) or valid_cap(conf_cap) or -1  -- cap_of's
      local c = total or n
      if cap <= 0 or (c + 1 ~= cap and c + 1 ~= cap + (valid_cap(reserve) or 0)) then
        -- fair_scope 'app': the group may stand out of its set below its cap (another
        -- queue's release marked it for this queue's next promote): look, as SQL does
        if total then cap = nil else cap = false end
      end
    end
  end
  if cap ~= false then refresh(g, nil, {n = n, cap = cap}) end
  if total then SC.freed(g) end
  if n <= 0 then forget_if_idle(g, n) end
end

-- A routed dispatch (fair_affinity: its record's `w`, the worker it was sent to) takes
-- (delta 1) or frees (-1) a slot of that worker; nothing for a dispatch not routed.
local function worker_slot(w, delta)
  if not w or w == '' then return end
  if redis.call('HINCRBY', K_WFLIGHT, w, delta) <= 0 then redis.call('HDEL', K_WFLIGHT, w) end
end

-- A worker holds dispatch `did` (received it, or runs it): extend its lease. A dispatch
-- whose slot was reclaimed ('lost') takes a slot again and counts as running; a tombstone
-- ('superseded', 'released') is left as it is. Returns the state it was in, or false.
-- `state`: the record's state when the caller has just read it.
local function hold_lease(did, deadline, state)
  local dk = k_dispatch(did)
  if state == nil then state = redis.call('HGET', dk, 's') end
  if not state or state == 'superseded' or state == 'released' then return state or false end
  if state == 'lost' then
    local g, cls, w, sg = unpack(redis.call('HMGET', dk, 'g', 'c', 'w', 'sg'))
    worker_slot(w, 1)
    if sg then redis.call('HINCRBY', SUBCAPS.flight, g .. '/' .. sg, 1) end
    redis.call('HINCRBY', k_group(g), 'n', 1)
    SC.add(g, 1)
    redis.call('HINCRBY', K_STAT, 'inflight', 1)
    if cls == 'i' then redis.call('HINCRBY', K_STAT, 'inflight:i', 1) end
    redis.call('SADD', K_GROUPS, g)
    redis.call('PERSIST', dk)
    redis.call('HSET', dk, 's', 'running')
    refresh(g)
  end
  redis.call('ZADD', K_LEASES, deadline, did)
  return state
end

