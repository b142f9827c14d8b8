-- wrk script: PUT a new workload per request, each with a unique name.
-- Each wrk thread gets its own id so names never collide across threads.
-- thread_id is a global on purpose: setup() sets it in each thread's Lua state.
local counter = 0
local next_id = 0

function setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
end

local body = [[{"spec":{"kind":"training","priority":5,"tasks":{"count":2,"resources":{"flavors":["h100"],"gpus":8,"cpus":32,"memory_mib":262144}},"run":{"command":["python","train.py"],"image":"registry.local/train:1"},"sim":{"duration_seconds":600}},"metadata":{"labels":{"project":"bench"}}}]]
local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN") }

function request()
  counter = counter + 1
  local path = string.format("/api/v1/teams/bench/workloads/w%d-%d", thread_id or 0, counter)
  return wrk.format("PUT", path, headers, body)
end

-- Paths are relative to the repository root, where bench/api-load runs wrk.
dofile("bench/report.lua")
