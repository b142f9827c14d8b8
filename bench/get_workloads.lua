-- wrk script: GET workloads by name, chosen at random among the seeded ones.
local seeded = tonumber(os.getenv("BENCH_SEEDED") or "1000")

function request()
  local path = string.format("/api/v1/teams/bench/workloads/seed-%d", math.random(0, seeded - 1))
  return wrk.format("GET", path)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_s=%.2f rps=%.0f p50_ms=%.2f p99_ms=%.2f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
