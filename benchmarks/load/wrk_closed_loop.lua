-- Closed-loop POST load for wrk: each connection is one client that sends its next request
-- when the previous answer arrives.
--
--   wrk -t 1 -c 8 -d 10s --timeout 30s -s wrk_closed_loop.lua URL -- BODIES PATH
--
-- BODIES holds one JSON body per line; the requests cycle through them, POSTed to PATH as
-- application/json. Counts answers per HTTP status and sums each stage of the Server-Timing header
-- (`queue;dur=0.4, encode;dur=30.1, total;dur=33`) over the 2xx answers. `done` prints one line,
-- WRK_JSON {...}: requests, duration_us, statuses, socket errors, latency p50/p90/p99/max/mean in ms
-- and the mean ms of each stage over the 2xx answers (a stage an answer lacks counts as 0).

local MARKER = "WRK_JSON "

-- per thread (wrk runs one Lua state per thread; `done` reads these with thread:get)
statuses = {}
stage_sums = {}
ok = 0

local requests = {}
local next_request = 0

function init(args)
   local bodies, path = args[1], args[2]
   if not bodies or not path then
      error("usage: wrk ... -s wrk_closed_loop.lua URL -- BODIES PATH")
   end
   local file = assert(io.open(bodies, "r"))
   for line in file:lines() do
      if line:find("%S") then
         requests[#requests + 1] = wrk.format("POST", path, {["Content-Type"] = "application/json"}, line)
      end
   end
   file:close()
   if #requests == 0 then
      error("no request bodies in " .. bodies)
   end
end

function request()
   next_request = next_request % #requests + 1
   return requests[next_request]
end

local function add_server_timing(value)
   for name, dur in value:gmatch("([%w_%-%.]+)%s*;[^,]*dur=([%d%.eE%+%-]+)") do
      stage_sums[name] = (stage_sums[name] or 0) + (tonumber(dur) or 0)
   end
end

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
   if status < 200 or status > 299 then
      return
   end
   ok = ok + 1
   for name, value in pairs(headers) do
      if name:lower() == "server-timing" then
         add_server_timing(value)
      end
   end
end

-- the main Lua state: collect the threads, then merge what each counted
local threads = {}

function setup(thread)
   threads[#threads + 1] = thread
end

local function json_object(entries)
   local parts = {}
   for key, value in pairs(entries) do
      parts[#parts + 1] = string.format("%q:%s", tostring(key), value)
   end
   table.sort(parts)
   return "{" .. table.concat(parts, ",") .. "}"
end

local function number(x)
   return string.format("%.3f", x)
end

function done(summary, latency, _)
   local all_statuses, sums, answered = {}, {}, 0
   for _, thread in ipairs(threads) do
      for status, count in pairs(thread:get("statuses")) do
         all_statuses[status] = (all_statuses[status] or 0) + count
      end
      for name, total in pairs(thread:get("stage_sums")) do
         sums[name] = (sums[name] or 0) + total
      end
      answered = answered + thread:get("ok")
   end
   local stages = {}
   for name, total in pairs(sums) do
      stages[name] = number(total / answered)
   end
   for status, count in pairs(all_statuses) do
      all_statuses[status] = string.format("%d", count)
   end
   local errors = {}
   for _, kind in ipairs({"connect", "read", "write", "timeout"}) do
      errors[kind] = string.format("%d", summary.errors[kind])
   end
   local latency_ms = {max = number(latency.max / 1000), mean = number(latency.mean / 1000)}
   for _, p in ipairs({50, 90, 99}) do
      latency_ms["p" .. p] = number(latency:percentile(p) / 1000)
   end
   io.write(MARKER, json_object({
      requests = string.format("%d", summary.requests),
      duration_us = string.format("%d", summary.duration),
      statuses = json_object(all_statuses),
      errors = json_object(errors),
      latency_ms = json_object(latency_ms),
      stages_ms = json_object(stages),
   }), "\n")
end
