-- Shared by the wrk scripts: prints one RESULT line that bench/api-load parses.
function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_s=%.2f rps=%.0f p50_ms=%.2f p99_ms=%.2f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
