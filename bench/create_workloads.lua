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
local headers = { ["Content-Type"] = "application/json" }

function request()
  counter = counter + 1
  local path = string.format("/api/v1/teams/bench/workloads/w%d-%d", thread_id or 0, counter)
  return wrk.format("PUT", path, headers, body)
end

local created = 0
local other = 0
function response(status)
  if status == 201 then created = created + 1 else other = other + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_s=%.2f rps=%.0f p50_ms=%.2f p99_ms=%.2f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
