--[[ picking: the pick itself, in one function shared by pick.lua, release.lua and hold.lua
(which refill: DESIGN.md "Refill in release").
PICK.run(A, told, handed, inflight): A holds pick.lua's ARGV (its header says what each
is: now, most to take, capacity, leases, id prefix, the direct push and affinity); the
answer is pick.lua's. `told` (optional): pushed-message entries (5 fields each) to
report before this call's own; `handed` (optional): picked triples to return before this
call's own; `inflight` (optional): the queue's dispatches in flight, when the caller read
them already (a refill did, to see whether there is room).
A function of its own, not the script's main chunk: Lua 5.1 allows one function 200
locals and 60 upvalues, and pick.lua's chunk with its includes was at 200; this one
reaches ~51 of the includes' locals (a new one used here counts against the 60).
PICK.refill(now): the same pick with the dispatcher's refill parameters (below).
Needs the includes common, singleton, kombu, routing and subcaps before it. ]]
local PICK = {}

function PICK.run(A, told, handed, inflight)
  local now, want, capacity = tonumber(A[1]), tonumber(A[2]), tonumber(A[3])
  local deadline = now + tonumber(A[4])
  local token = A[5] .. redis.call('HINCRBY', K_STAT, 'picks', 1) .. '.'
  local target = A[6]
  if target == '' then target = nil end
  local routing = A[13] and A[13] ~= '' and routing_of(A[13], A[14], now) or nil
  if capacity >= 0 then
    local room = capacity - (inflight or tonumber(redis.call('HGET', K_STAT, 'inflight') or '0'))
    if room < want then want = room end
  end
  if redis.call('ZSCORE', K_PAUSES, '') then want = 0 end  -- the whole queue is paused
  local default_weight = valid_weight(redis.call('HGET', K_CONF, 'weight')) or 1
  local default_cap = valid_cap(redis.call('HGET', K_CONF, 'cap')) or -1
  local default_rate = redis.call('HGET', K_CONF, 'rate') or false
  -- no default rate and no group's own: nothing to meter, no read per message
  local rated = default_rate or redis.call('HLEN', K_RATES) > 0

  -- Read once per call, per group: its cap, its pick weight and its rate in force (no
  -- script changes them while this one runs).
  -- A hash with no field at all (no group has a cap, weight or boost of its own: the
  -- common case) is not read per group: with 10,000 groups backlogged a group is new to
  -- nearly every message, and these reads were half of its commands. Each is looked at
  -- when first needed (a call that takes nothing reads none).
  local in_call = {caps = {}, weights = {}, rates = {}}
  local function cap_in_call(g)
    if in_call.own_cap == nil then in_call.own_cap = redis.call('HLEN', K_CAPS) > 0 end
    if not in_call.own_cap then return default_cap end
    local caps = in_call.caps
    if caps[g] == nil then caps[g] = cap_of(g, default_cap) end
    return caps[g]
  end
  local function weight_in_call(g)
    if in_call.own_weight == nil then
      in_call.own_weight = redis.call('HLEN', K_WEIGHTS) + redis.call('HLEN', K_BOOSTS) > 0
    end
    if not in_call.own_weight then return default_weight end
    local weights = in_call.weights
    if weights[g] == nil then weights[g] = pick_weight_of(g, default_weight) end
    return weights[g]
  end

  -- Written once per call rather than per message: the virtual time of each class (the
  -- last tag taken there) and each group's in-flight count and tags, unless a refresh or
  -- a forget of the group is to read them first (write_pending).
  local vt_due, pending = {}, {}  -- class -> vt; group -> {n = taken, t<class> = tag}
  local function write_pending(g)
    if next(vt_due) then
      local fields = {}
      for cls, v in pairs(vt_due) do fields[#fields + 1] = cls; fields[#fields + 1] = v end
      redis.call('HSET', K_VT, unpack(fields))
      vt_due = {}
    end
    local p = g and pending[g]
    if not p then return end
    pending[g] = nil
    redis.call('HINCRBY', k_group(g), 'n', p.n)
    if p.ti or p.tb then
      redis.call('HSET', k_group(g), unpack(p.ti and p.tb and {'ti', p.ti, 'tb', p.tb}
                                            or p.ti and {'ti', p.ti} or {'tb', p.tb}))
    end
  end

  -- g was just picked: count it against its rate (GCRA, policy `gcra`, the same arithmetic
  -- in the same order; a token counts from its TAT or from RATE_EARLY_MS, at most half an
  -- interval, before now, whichever is later) and, once its bucket is empty, throttle it until its next token is due:
  -- it leaves the ready sets, and promote lifts it then.
  local function meter(g)
    if not rated then return end
    local rates = in_call.rates
    if rates[g] == nil then rates[g] = {rate_of(g, default_rate)} end
    local interval, burst = rates[g][1], rates[g][2]
    if not interval then return end
    local tat = tonumber(redis.call('ZSCORE', K_TATS, g))
    local floor = now - math.min(RATE_EARLY_MS, interval / 2)
    if not tat or tat < floor then tat = floor end
    tat = tat + interval
    redis.call('ZADD', K_TATS, tat, g)
    local free_at = tat - (burst - 1) * interval
    if free_at > now then
      PICK.throttled = true  -- a refill wakes the dispatcher: its promote lifts it in time
      redis.call('ZADD', K_THROTTLED, free_at, g)
      for _, cls in ipairs(CLASSES) do
        redis.call('ZREM', k_ready(cls), g)
        if soft_caps() then redis.call('ZREM', k_over(cls), g) end
      end
    end
  end

  -- The interactive ready set is skipped while empty; only a full refresh can fill it.
  local interactive_empty = redis.call('ZCARD', k_ready('i')) == 0
  -- the companions, read in one call: the policy and subgroups (harmony()'s), the charge,
  -- the cap mode (soft_caps()'s) and the interactive share
  local conf_policy, conf_charge, conf_capmode, conf_ishare, conf_subgroup, conf_scope,
        conf_pathcaps = unpack(redis.call('HMGET', K_CONF, 'policy', 'charge', 'capmode',
                                          'ishare', 'subgroup', 'scope', 'pathcaps'))
  if SC.read == nil then SC.read = conf_scope == 'app' end  -- fair_scope: no read of its own
  -- caps per subgroup: heads are looked at only while some cap is keyed by a path
  SUBCAPS.on = conf_pathcaps == '1'
  if policy_read == nil then policy_read = conf_policy or 'wfq' end
  if subgroup_read == nil then subgroup_read = conf_subgroup == 'path' end
  if soft_read == nil then soft_read = conf_capmode == 'soft' end
  local harmonious, soft = harmony(), soft_caps()
  local charge = conf_charge or 'cost'
  -- the interactive share's bound, in dispatches (nil: none), and the interactive in flight
  -- (read only under a share); taken_i: the interactive dispatches this call takes
  local share = capacity >= 0 and tonumber(conf_ishare or '')
  local share_bound = share and share * capacity
  local inflight_i = share_bound and tonumber(redis.call('HGET', K_STAT, 'inflight:i') or '0') or 0
  local taken_i = 0
  local function top_of(k, cls)  -- the set's head (with affinity: among those that may go)
    if routing then return routed_top(routing, k, cls) end
    return redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  end
  local function head_of(k_set, skip_i)
    if share_bound and inflight_i >= share_bound then  -- background first, while it waits
      local top = top_of(k_set('b'), 'b')
      if top[1] then return 'b', top[1], tonumber(top[2]) end
    end
    local best = nil
    for _, cls in ipairs(CLASSES) do
      if cls ~= 'i' or not skip_i then
        local top = top_of(k_set(cls), cls)
        if top[1] and not harmonious then return cls, top[1], tonumber(top[2]) end
        local score = top[1] and tonumber(top[2])
        if score and (not best or score < best[3] or (score == best[3] and top[1] < best[2])) then
          best = {cls, top[1], score}
        end
      end
    end
    if best then return best[1], best[2], best[3] end
  end
  local function head()
    local cls, g, tag = head_of(k_ready, interactive_empty)
    if cls or not soft then return cls, g, tag end
    return head_of(k_over, false)
  end

  -- Direct push: may a message with this exchange and routing key go to `target` directly?
  local steps, sep, own_route, pushed_due = {}, A[7], false, nil
  if target then
    for step in string.gmatch(A[8], '[^,]+') do steps[#steps + 1] = tonumber(step) end
    if A[10] ~= '' then
      own_route = true
      for _, binding in ipairs(redis.call('SMEMBERS', A[12])) do
        -- "<routing key><sep><pattern><sep><queue>"
        local a = string.find(binding, sep, 1, true)
        local b = a and string.find(binding, sep, a + #sep, true)
        if not b or (string.sub(binding, 1, a - 1) == A[11]
                     and string.sub(binding, b + #sep) ~= target) then
          own_route = false
        end
      end
    end
  end

  local function push(did, value)
    local meta, headers, properties, body = envelope_parts(value)
    if not meta then return false end
    pushed_due = meta.t
    if not ((meta.e == '' and meta.r == target) or
            (own_route and meta.e == A[10] and meta.r == A[11])) then
      return false
    end
    if not string.find(headers, '"expires": null', 1, true) then return false end
    local message, priority = kombu_message(did, target, meta, headers, properties, body,
                                            tonumber(A[9]))
    redis.call('LPUSH', kombu_list(target, sep, steps, priority), message)
    return true
  end

  -- a pick's answer starts with what release.lua refilled and handed on (`told`, `handed`)
  local out, taken, pushed_info = handed or {}, 0, told or {}
  local pushed = #pushed_info / 5
  local popped, popped_total = {}, {i = 0, b = 0}  -- ids taken off each group's lists
  local new_head = {}  -- group -> {class -> true}: a message taken off that list's head
  local routed = {}  -- affinity: the worker of each message in `out`, in order
  -- Caps per subgroup: park the heads of g's class list while their subgroup is at its cap
  -- (SUBCAPS.room 0), taken off as a pick takes them (pop_held: the virtual time moves past
  -- their keys) into their subgroup's parked list; true when any was (the head changed, g
  -- may have left the ready sets). FairQueue._park_capped.
  function SUBCAPS.park_heads(cls, g)
    local list, parked = k_list(cls, g), 0
    while true do
      local id = redis.call('LINDEX', list, 0)
      local sg = id and subgroup_of(redis.call('HGET', K_MSG, id) or '') or ''
      if sg == '' or SUBCAPS.room(g .. '/' .. sg) ~= 0 then break end
      pop_held(cls, g)
      redis.call('RPUSH', SUBCAPS.key(cls, g, sg), id)
      redis.call('SADD', SUBCAPS.parked, cls .. ':' .. g .. '/' .. sg)
      parked = parked + 1
    end
    if parked == 0 then return false end
    redis.call('HINCRBY', k_group(g), 'pk', parked)
    redis.call('HSET', k_group(g), 'h' .. cls, A[1])
    write_pending(g)
    refresh(g, default_cap, {cap = cap_in_call(g)})
    interactive_empty = false
    return true
  end

  local synced = {}  -- fair_scope 'app' (wfq): heads whose charges elsewhere were taken
  while taken < want and not (routing and routing.open == 0) do
    local cls, g, tag = head()
    while cls and SUBCAPS.on and subgroups() and SUBCAPS.park_heads(cls, g) do
      cls, g, tag = head()
    end
    if not cls then break end
    local stale = SC.stale(cls, g, cap_in_call(g))
    local behind = not stale and SC.behind(cls, g, synced)
    if stale then
      -- fair_scope 'app': at its cap across the app's queues since it was ranked here
      write_pending(g)
      refresh(g, default_cap, {cap = cap_in_call(g)})
      interactive_empty = false
    elseif behind then
      -- fair_scope 'app' (wfq): charged by other queues since this one last looked: its
      -- tag takes that, its score moves, and the pick looks again
      local moved = string.format('%.17g', tag + behind)
      local p = pending[g]
      if p and p['t' .. cls] then p['t' .. cls] = tag + behind
      else redis.call('HSET', k_group(g), 't' .. cls, moved) end
      redis.call('ZADD', k_ready(cls), 'XX', moved, g)
      if soft then redis.call('ZADD', k_over(cls), 'XX', moved, g) end
    else
      local id = pop_held(cls, g)
      if id then
        popped[g] = (popped[g] or 0) + 1
        popped_total[cls] = popped_total[cls] + 1
      end
      local value = id and redis.call('HGET', K_MSG, id)
      local m = value and decode(value)
      if value and not m then
        quarantine(id, value, 'pick: undecodable stored value')
        out[#out + 1] = ''
        out[#out + 1] = id
        out[#out + 1] = ''
      end
      if not m then
        -- nothing taken (an id without a message, or quarantined): maybe nothing left
        write_pending(g)
        if id then
          redis.call('HSET', k_group(g), 'h' .. cls, A[1])  -- before a forget
          singleton_removed(id, A[1])  -- a quarantined owner passes its key on
        end
        redis.call('ZREM', k_ready(cls), g)
        if soft then redis.call('ZREM', k_over(cls), g) end
        refresh(g, default_cap, {cap = cap_in_call(g)})
        forget_if_idle(g)
        interactive_empty = false
      else
        redis.call('HDEL', K_MSG, id)
        unindex_copy(id)
        local gk = k_group(g)
        local p = pending[g] or {n = 0}
        pending[g], p.n = p, p.n + 1
        SC.add(g, 1)  -- fair_scope 'app': counted at once, a later head reads it
        local estimate = nil  -- what a 'runtime' charge corrects at release
        if harmonious then  -- served now; a jump (boost_task.lua) is spent
          redis.call('HSET', gk, 's', redis.call('HINCRBY', K_STAT, 'served', 1))
          redis.call('HDEL', gk, 'j')
        else
          vt_due[cls] = tag
          local spent = m.cost
          if charge == 'count' then
            spent = 1
          elseif charge == 'runtime' then
            spent = finite(redis.call('HGET', gk, 'r')) or m.cost
            estimate = spent
          end
          tag = tag + spent / weight_in_call(g)
          p['t' .. cls] = tag
          SC.charged(cls, g, spent / weight_in_call(g))  -- wfq shares across queues
        end
        if cls == 'i' then inflight_i, taken_i = inflight_i + 1, taken_i + 1 end
        local heads = new_head[g] or {}
        heads[cls], new_head[g] = true, heads
        if routing then routing.headed[cls .. g] = true end  -- for its spill (route)
        taken = taken + 1
        local did = token .. taken
        if subgroups() then SUBCAPS.picked(g, value, did) end
        singleton_picked(id, did)  -- the key goes with the record (`k`)
        if target and push(did, value) then
          -- the bytes stay with the record until a worker reports it (as confirm.lua keeps
          -- them): a copy the broker lost is held again when the lease runs out
          redis.call('HSET', k_dispatch(did), 's', 'queued', 'g', g, 'c', cls, 'id', id,
                     'v', value)
          if estimate then redis.call('HSET', k_dispatch(did), 'e', estimate) end
          redis.call('ZADD', K_LEASES, tonumber(A[9]), did)
          pushed = pushed + 1
          -- for the dispatcher's metrics and log: class, due time, group, hold id, dispatch id
          pushed_info[#pushed_info + 1] = cls
          pushed_info[#pushed_info + 1] = pushed_due and string.format('%.17g', pushed_due) or ''
          pushed_info[#pushed_info + 1] = g
          pushed_info[#pushed_info + 1] = id
          pushed_info[#pushed_info + 1] = did
        else
          redis.call('HSET', k_dispatch(did), 's', 'picked', 'g', g, 'c', cls, 'id', id,
                     'v', value)
          if estimate then redis.call('HSET', k_dispatch(did), 'e', estimate) end
          if routing then
            routed[#routed + 1] = routing.host[cls]
            routed_taken(routing, routing.host[cls], did)
          end
          redis.call('ZADD', K_LEASES, deadline, did)
          out[#out + 1] = did
          out[#out + 1] = id
          out[#out + 1] = value
        end
        if harmonious then  -- its rank moved, in both classes
          write_pending(g)
          refresh(g, default_cap, {cap = cap_in_call(g)})
          interactive_empty = false
        elseif cap_in_call(g) < 0 then
          -- Without a cap only this class's membership can change: re-rank at the new tag
          -- (it is above the virtual time just set) or drop the group when it has run dry.
          if redis.call('LLEN', k_list(cls, g)) > 0 then
            -- formatted once, for the score and the group's tag written at the end
            local score = string.format('%.17g', tag)
            p['t' .. cls] = score
            redis.call('ZADD', k_ready(cls), score, g)
          else
            redis.call('ZREM', k_ready(cls), g)
          end
        else
          -- the tag moved and the cap may be reached: re-rank or drop the group in each class
          redis.call('ZREM', k_ready(cls), g)
          write_pending(g)
          refresh(g, default_cap, {cap = cap_in_call(g)})
          interactive_empty = false
        end
        meter(g)
      end
    end
  end
  if taken > 0 then redis.call('HINCRBY', K_STAT, 'inflight', taken) end
  if taken_i > 0 then redis.call('HINCRBY', K_STAT, 'inflight:i', taken_i) end
  write_pending(nil)  -- the virtual times
  -- each group taken from: its in-flight count, then one HSET of its tags and the head
  -- times of the lists taken from (the next message is the head since now; a stale time
  -- for an empty list, which the next message in stamps again)
  for g, heads in pairs(new_head) do
    local p, fields = pending[g], {}
    if p then
      redis.call('HINCRBY', k_group(g), 'n', p.n)
      for _, cls in ipairs(CLASSES) do
        if p['t' .. cls] then fields[#fields + 1] = 't' .. cls; fields[#fields + 1] = p['t' .. cls] end
      end
    end
    for _, cls in ipairs(CLASSES) do
      if heads[cls] then fields[#fields + 1] = 'h' .. cls; fields[#fields + 1] = A[1] end
    end
    redis.call('HSET', k_group(g), unpack(fields))
  end
  -- the held counters, once per group and class rather than per message
  for g, n in pairs(popped) do rank_backlog(g, -n) end
  for cls, n in pairs(popped_total) do
    if n > 0 then redis.call('HINCRBY', K_STAT, 'held:' .. cls, -n) end
  end
  if routing then return {out, routed, unassigned_of(routing)} end
  if not target then return out end
  -- {pushed, (class, due, group, hold id, dispatch id) per pushed message, then the
  -- picked triples}
  local answer = {pushed}
  for _, x in ipairs(pushed_info) do answer[#answer + 1] = x end
  for _, x in ipairs(out) do answer[#answer + 1] = x end
  return answer
end

-- Refill (release.lua, hold.lua): pick with the parameters the dispatcher's last pick left
-- (`RF.params`) at `now` (ms; nil: Redis's clock), when the queue has room; what was pushed goes to
-- `RF.told`, what was picked but not pushed to `RF.handed`, with a wake-up. Returns how
-- many it took, or false when there are no parameters (no live dispatcher refills: the
-- caller wakes one).
-- `RF.told` waiting for a dispatcher to drain it: it is woken at TELL fields, and past
-- KEEP (a dispatcher gone for good) the oldest are dropped (they feed metrics only).
local REFILL = {TELL = 1000, KEEP = 5000}
function PICK.refill(now)
  local q, sep, steps, ex, rk, bk, cap, lease, qlease, tok, want = unpack(redis.call(
    'HMGET', RF.params, 'q', 'sep', 'steps', 'ex', 'rk', 'bk', 'cap', 'lease', 'qlease',
    'tok', 'want'))
  if not (q and want) then return false end
  now = now or singleton_now()  -- Redis's clock only when the caller has none
  -- no room (a busy queue's hold): no pick call at all
  local inflight = tonumber(redis.call('HGET', K_STAT, 'inflight') or '0')
  if inflight >= tonumber(cap) then return 0 end
  local answer = PICK.run({string.format('%d', now), want, cap, lease, tok, q, sep, steps,
                           now + tonumber(qlease), ex, rk, bk}, nil, nil, inflight)
  local n = 5 * answer[1]
  if n > 0 then
    local waiting = redis.call('RPUSH', RF.told, unpack(answer, 2, n + 1))
    if waiting >= REFILL.TELL then wake() end
    if waiting > REFILL.KEEP then redis.call('LTRIM', RF.told, -REFILL.KEEP, -1) end
  end
  local handed = false
  for i = n + 2, #answer, 3 do
    -- an undecodable one ('' for its dispatch id) is in the quarantine already
    if answer[i] ~= '' then redis.call('RPUSH', RF.handed, answer[i]); handed = true end
  end
  if handed or PICK.throttled then wake() end
  return answer[1] + (#answer - 1 - n) / 3  -- pushed, then picked or quarantined
end
