import { useState } from "preact/hooks";
import { Cluster, InventoryEntry, ReportBucket, Team, UsageReport, WorkloadSummary, all, api, reportPath } from "../api";
import { usePoll } from "../app";
import { StackedChart } from "../chart";
import { bucketLabel, teamLayers } from "./reports";

interface OverviewData {
  clusters: Cluster[];
  teams: Team[];
  summary: WorkloadSummary;
}

async function load(): Promise<OverviewData> {
  const [clusters, teams, summary] = await Promise.all([
    all<Cluster>("/api/v1/clusters"),
    all<Team>("/api/v1/teams"),
    api<WorkloadSummary>("/api/v1/workloads/summary"),
  ]);
  return { clusters, teams, summary };
}

/// The chart's periods (hours back from now) and the bucket each is drawn in.
const PERIODS: [number, string, ReportBucket][] = [
  [1, "last hour", "minute"],
  [24, "last 24 hours", "hour"],
  [24 * 7, "last 7 days", "hour"],
  [24 * 30, "last 30 days", "day"],
  [24 * 90, "last 90 days", "day"],
];

/// The layer of a team's own work when the chart shows the teams below it.
const OWN = " (its own work)";

/// The layer `team`'s use counts in when the chart shows the teams right below `focus`
/// (`null`: the departments, the top-level teams): the ancestor of `team`, or `team`
/// itself, whose parent is `focus`; `focus`'s own work has a layer of its own; a team
/// outside `focus`'s subtree counts in none. A team whose parent the reader cannot see
/// is a department to it.
export function layerOf(team: string, parents: Map<string, string | null>, focus: string | null): string | null {
  if (focus !== null && team === focus) return focus + OWN;
  const seen = new Set<string>();
  for (let t = team; !seen.has(t); ) {
    seen.add(t);
    const p = parents.get(t) ?? null;
    const top = p === null || !parents.has(p);
    if (focus === null ? top : p === focus) return t;
    if (top) return null;
    t = p;
  }
  return null;
}

/// GPUs in use over time, one flavor at a time: per department, or per team below the
/// department (or team) clicked in the legend; the average of each bucket, from the usage
/// report (so 90 days back as readily as an hour). Seven layers at most, the rest as one.
export function UsageByTeam() {
  const [period, setPeriod] = useState(24);
  const [flavor, setFlavor] = useState<string | null>(null);
  const [focus, setFocus] = useState<string | null>(null);
  const bucket = PERIODS.find((p) => p[0] === period)![2];
  const [report, error] = usePoll(
    () => {
      const to = new Date();
      const from = new Date(to.getTime() - period * 3600_000);
      const path = reportPath({ from: from.toISOString(), to: to.toISOString(), group_by: ["team", "flavor"], bucket });
      return api<UsageReport>(path);
    },
    [period],
    30_000,
  );
  const flavors = [...new Set((report?.rows ?? []).map((r) => r.flavor ?? ""))].filter(Boolean).sort();
  const shown = flavor && flavors.includes(flavor) ? flavor : (flavors[0] ?? null);
  const parents = new Map((report?.teams ?? []).map((t) => [t.team, t.parent ?? null]));
  const hasChildren = new Set([...parents.values()].filter((p): p is string => p !== null));
  const path: string[] = [];
  for (let t = focus; t !== null && !path.includes(t); t = parents.get(t) ?? null) path.unshift(t);
  const chart =
    report &&
    (() => {
      const { bounds, layers } = teamLayers(
        report,
        bucket,
        (r) => (r.flavor === shown ? layerOf(r.team ?? "", parents, focus) : null),
        focus === null ? "departments" : "teams",
      );
      const hours = (i: number) => (bounds[i + 1] - bounds[i]) / 3_600_000;
      // GPU-hours in a bucket over its length: the GPUs in use on average in it.
      const gpus = layers.map((l) => ({ label: l.label, values: l.values.map((v, i) => v / hours(i)) }));
      const span = (bounds[bounds.length - 1] - bounds[0]) / 3_600_000;
      const average = (values: number[]) => values.reduce((a, v, i) => a + v * hours(i), 0) / span;
      return { bounds, layers: gpus, average };
    })();
  const under = focus === null ? "department" : `team under ${focus}`;
  return (
    <section aria-labelledby="chart-heading">
      <h2 id="chart-heading">GPUs in use by {focus === null ? "department" : `team under ${focus}`}</h2>
      <div class="filters">
        <label>
          Period{" "}
          <select value={period} onChange={(e) => setPeriod(Number(e.currentTarget.value))}>
            {PERIODS.map(([h, words]) => (
              <option value={h}>{words}</option>
            ))}
          </select>
        </label>
        <label>
          Flavor{" "}
          <select value={shown ?? ""} onChange={(e) => setFlavor(e.currentTarget.value)}>
            {flavors.map((f) => (
              <option>{f}</option>
            ))}
          </select>
        </label>
      </div>
      <nav aria-label="Chart level" class="crumbs">
        {focus === null ? (
          <span aria-current="location">All departments</span>
        ) : (
          <button type="button" class="link" onClick={() => setFocus(null)}>
            All departments
          </button>
        )}
        {path.map((t) => (
          <>
            {" › "}
            {t === focus ? (
              <span aria-current="location">{t}</span>
            ) : (
              <button type="button" class="link" onClick={() => setFocus(t)}>
                {t}
              </button>
            )}
          </>
        ))}
      </nav>
      {error && <p class="error" role="alert">{error.message}</p>}
      {!chart ? (
        <p class="loading">Loading…</p>
      ) : (
        <StackedChart
          bounds={chart.bounds}
          layers={chart.layers}
          label={`Average ${shown ?? ""} GPUs in use per ${under} and ${bucket}, stacked`}
          unit="GPUs"
          format={fmt}
          when={bucketLabel(bucket)}
          legendValue={chart.average}
          pickable={(label) => hasChildren.has(label)}
          onPick={setFocus}
        />
      )}
    </section>
  );
}

export function Overview() {
  const [data, error] = usePoll(load);
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
      <UsageByTeam />
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
