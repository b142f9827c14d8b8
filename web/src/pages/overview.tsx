import { useState } from "preact/hooks";
import { Cluster, InventoryEntry, Team, UsageHistory, WorkloadSummary, all, api } from "../api";
import { usePoll } from "../app";
import { UsageChart } from "../chart";

interface OverviewData {
  clusters: Cluster[];
  teams: Team[];
  history: UsageHistory;
  summary: WorkloadSummary;
}

/// The chart's periods, in hours.
const PERIODS: [number, string][] = [
  [1, "last hour"],
  [24, "last 24 hours"],
  [24 * 7, "last 7 days"],
];

async function load(hours: number): Promise<OverviewData> {
  const since = new Date(Date.now() - hours * 3600_000).toISOString();
  const [clusters, teams, history, summary] = await Promise.all([
    all<Cluster>("/api/v1/clusters"),
    all<Team>("/api/v1/teams"),
    api<UsageHistory>(`/api/v1/usage/history?since=${encodeURIComponent(since)}`),
    api<WorkloadSummary>("/api/v1/workloads/summary"),
  ]);
  return { clusters, teams, history, summary };
}

export function Overview() {
  const [hours, setHours] = useState(24);
  const [data, error] = usePoll(() => load(hours), [hours]);
  if (!data) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const rows = data.clusters.flatMap((c) =>
    (c.status.inventory.length ? c.status.inventory : [null]).map((inv, i) => ({ c, inv, first: i === 0 })),
  );
  const totals = new Map<string, { total: number; free: number }>();
  for (const c of data.clusters)
    for (const inv of c.status.inventory) {
      const t = totals.get(inv.flavor) ?? { total: 0, free: 0 };
      totals.set(inv.flavor, { total: t.total + inv.gpus_total, free: t.free + inv.gpus_free });
    }
  const borrowing = data.teams.filter((t) => t.status.usage.some((u) => u.borrowed > 0));
  return (
    <>
      <h1>Overview</h1>
      {error && <p class="error" role="alert">Not refreshed: {error.message}</p>}
      <section aria-labelledby="gpus-heading" class="cards">
        <h2 id="gpus-heading" class="visually-hidden">GPUs by flavor</h2>
        {[...totals].map(([flavor, t]) => (
          <div class="card" data-flavor={flavor}>
            <div class="card-title">{flavor}</div>
            <div class="big">
              <span data-testid={`allocated-${flavor}`}>{fmt(t.total - t.free)}</span> / {fmt(t.total)}
            </div>
            <div class="muted">GPUs allocated · {fmt(t.free)} free</div>
          </div>
        ))}
      </section>
      <section aria-labelledby="phases-heading">
        <h2 id="phases-heading">Workloads by phase</h2>
        <table class="phases">
          <thead>
            <tr>
              <th scope="col">Phase</th>
              <th scope="col" class="num">Workloads</th>
              <th scope="col" class="num">GPUs</th>
            </tr>
          </thead>
          <tbody>
            {data.summary.phases.map((p) => (
              <tr data-phase={p.phase}>
                <td>
                  <a href={`#/workloads?phase=${p.phase}`}>{p.phase}</a>
                </td>
                <td class="num">{p.workloads}</td>
                <td class="num">
                  {FINAL.includes(p.phase) ? (
                    <a href="#/reports" title="Finished work holds no GPUs: its GPU-hours are in Reports">
                      —
                    </a>
                  ) : (
                    fmt(p.gpus)
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>
      <section aria-labelledby="clusters-heading">
        <h2 id="clusters-heading">Clusters</h2>
        <table>
          <thead>
            <tr>
              <th scope="col">Cluster</th>
              <th scope="col">Kind</th>
              <th scope="col">Health</th>
              <th scope="col">Flavor</th>
              <GpuHeads />
            </tr>
          </thead>
          <tbody>
            {rows.map(({ c, inv, first }) => (
              <tr data-cluster={c.metadata.name} data-flavor={inv?.flavor}>
                <td>{first && c.metadata.name}</td>
                <td>{first && c.spec.kind}</td>
                <td>
                  {first && (
                    <span class={`badge ${c.status.health.toLowerCase()}`} title={c.status.message ?? undefined}>
                      {c.status.health}
                      {c.spec.cordoned ? " · cordoned" : ""}
                    </span>
                  )}
                </td>
                <td>{inv?.flavor ?? "—"}</td>
                {inv ? <GpuCells inv={inv} /> : <td colSpan={3} />}
              </tr>
            ))}
          </tbody>
        </table>
      </section>
      <section aria-labelledby="chart-heading">
        <h2 id="chart-heading">GPUs allocated per team</h2>
        <label>
          Period{" "}
          <select value={hours} onChange={(e) => setHours(Number(e.currentTarget.value))}>
            {PERIODS.map(([h, words]) => (
              <option value={h}>{words}</option>
            ))}
          </select>
        </label>
        <UsageChart history={data.history} />
      </section>
      <section aria-labelledby="borrowing-heading">
        <h2 id="borrowing-heading">Borrowing now</h2>
        {borrowing.length === 0 ? (
          <p class="muted">No team holds more than its guarantee.</p>
        ) : (
          <ul>
            {borrowing.map((t) => (
              <li>
                {t.metadata.name}:{" "}
                {t.status.usage
                  .filter((u) => u.borrowed > 0)
                  .map((u) => `${fmt(u.borrowed)} ${u.flavor} GPUs above its guarantee`)
                  .join(", ")}
              </li>
            ))}
          </ul>
        )}
      </section>
    </>
  );
}

/// The headers of [`GpuCells`].
export function GpuHeads() {
  return (
    <>
      <th scope="col" class="num">GPUs</th>
      <th scope="col" class="num">Allocated</th>
      <th scope="col" class="num">Free</th>
    </>
  );
}

/// A flavor's GPUs on a cluster: total, allocated, free (three cells).
export function GpuCells({ inv }: { inv: InventoryEntry }) {
  return (
    <>
      <td class="num">{fmt(inv.gpus_total)}</td>
      <td class="num">{fmt(inv.gpus_total - inv.gpus_free)}</td>
      <td class="num">{fmt(inv.gpus_free)}</td>
    </>
  );
}

/// Phases of work that has ended: it holds no GPUs, so summing its GPUs means nothing.
const FINAL = ["Succeeded", "Failed", "Cancelled"];

/// GPUs with at most two decimals (fractional GPUs exist).
export function fmt(gpus: number): string {
  return String(Math.round(gpus * 100) / 100);
}
