-- wrk script: GET workloads by name, chosen at random among the seeded ones.
local seeded = tonumber(os.getenv("BENCH_SEEDED") or "1000")

local headers = { ["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN") }

function request()
  local path = string.format("/api/v1/teams/bench/workloads/seed-%d", math.random(0, seeded - 1))
  return wrk.format("GET", path, headers)
end

-- Paths are relative to the repository root, where bench/api-load runs wrk.
dofile("bench/report.lua")
