import { useEffect, useState } from "preact/hooks";
import { ApiError, Budget, BudgetAction, BudgetStatus, ReportBucket, Team, TeamUsage, UsageReport, UsageRow, all, api, apiBlob, reportPath } from "../api";
import { usePoll } from "../app";
import { Layer, StackedChart } from "../chart";

const DAY = 86_400_000;
const BUCKETS: ReportBucket[] = ["hour", "day", "week", "month"];
/// Teams drawn apart in the chart; the others are summed as one layer.
const CHART_TEAMS = 7;
const TOP_CONSUMERS = 10;

const ONE = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const TWO = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });

/// GPU-hours with one decimal.
export function hours(x: number): string {
  const r = Math.round(x * 10) / 10;
  return ONE.format(r === 0 ? 0 : r);
}

/// A cost with two decimals (in whatever currency the flavors' prices are in).
export function money(x: number): string {
  const r = Math.round(x * 100) / 100;
  return TWO.format(r === 0 ? 0 : r);
}

/// A cost, marked `*` (as `berth usage` marks it) where GPU-hours of flavors without a price
/// are not in it: the rows and the teams' month showed such a cost as if it were the whole.
export function Cost({ of }: { of: { cost: number; unpriced_gpu_hours: number } }) {
  if (of.unpriced_gpu_hours <= 0) return <>{money(of.cost)}</>;
  return (
    <span title={`not counting ${hours(of.unpriced_gpu_hours)} GPU-hours of flavors without a price`}>
      {money(of.cost)}*
    </span>
  );
}

function percent(part: number, whole: number): string {
  return whole > 0 ? `${Math.round((part / whole) * 100)} %` : "—";
}

/// A UTC day (YYYY-MM-DD) `n` days after `day`.
function addDays(day: string, n: number): string {
  return new Date(Date.parse(`${day}T00:00:00Z`) + n * DAY).toISOString().slice(0, 10);
}

function today(): string {
  return new Date().toISOString().slice(0, 10);
}

/// The preset periods: inclusive UTC days, ending today.
const PRESETS: { label: string; range: () => { from: string; to: string } }[] = [
  { label: "This month", range: () => ({ from: `${today().slice(0, 8)}01`, to: today() }) },
  { label: "Last 7 days", range: () => ({ from: addDays(today(), -6), to: today() }) },
  { label: "Last 30 days", range: () => ({ from: addDays(today(), -29), to: today() }) },
];

function isDay(s: string | null): s is string {
  return !!s && /^\d{4}-\d{2}-\d{2}$/.test(s) && !Number.isNaN(Date.parse(`${s}T00:00:00Z`));
}

/// The report's instants for the days `from` to `to`, both included.
function instants(from: string, to: string) {
  return { from: `${from}T00:00:00Z`, to: `${addDays(to, 1)}T00:00:00Z` };
}

/// The start of the bucket holding `t` (UTC; weeks start on Monday), as the API cuts them.
export function floor(t: number, b: ReportBucket): number {
  const d = new Date(t);
  switch (b) {
    case "minute":
      return Math.floor(t / 60_000) * 60_000;
    case "hour":
      return Math.floor(t / 3_600_000) * 3_600_000;
    case "day":
      return Math.floor(t / DAY) * DAY;
    case "week":
      return Math.floor(t / DAY) * DAY - ((d.getUTCDay() + 6) % 7) * DAY;
    case "month":
      return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
  }
}

export function next(t: number, b: ReportBucket): number {
  const d = new Date(t);
  if (b === "month") return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
  return t + { minute: 60_000, hour: 3_600_000, day: DAY, week: 7 * DAY }[b];
}

/// How a bucket's start reads on the chart's axis.
export function bucketLabel(b: ReportBucket): (t: number) => string {
  const opts: Intl.DateTimeFormatOptions =
    b === "minute"
      ? { hour: "2-digit", minute: "2-digit", hourCycle: "h23" }
      : b === "hour"
      ? { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23" }
      : b === "month"
        ? { month: "short", year: "numeric" }
        : { month: "short", day: "numeric" };
  const f = new Intl.DateTimeFormat("en-US", { ...opts, timeZone: "UTC" });
  return (t) => f.format(t);
}

/// Each team's GPU-hours per bucket of a `group_by=team` report over `[from, to)`: the
/// buckets' edges (the first and last cut to the period) and a layer per team, the largest
/// first; beyond `CHART_TEAMS`, the rest as one layer. `layerOf` names the layer a row
/// counts in (default: its team; `null`: none); the rest are `others` in the legend.
export function teamLayers(
  report: UsageReport,
  bucket: ReportBucket,
  layerOf: (row: UsageRow) => string | null = (r) => r.team ?? "",
  others = "teams",
): { bounds: number[]; layers: Layer[] } {
  const [from, to] = [Date.parse(report.from), Date.parse(report.to)];
  const starts = new Set<number>();
  for (let s = floor(from, bucket); s < to && starts.size < 10_000; s = next(s, bucket)) starts.add(s);
  for (const r of report.rows) if (r.bucket) starts.add(Date.parse(r.bucket));
  const sorted = [...starts].sort((a, b) => a - b);
  const index = new Map(sorted.map((s, i) => [s, i]));
  const bounds = [...sorted.map((s) => Math.max(s, from)), to];
  const byTeam = new Map<string, number[]>();
  for (const r of report.rows) {
    const team = layerOf(r);
    if (team === null) continue;
    const values = byTeam.get(team) ?? new Array(sorted.length).fill(0);
    values[index.get(r.bucket ? Date.parse(r.bucket) : sorted[0])!] += r.gpu_hours;
    byTeam.set(team, values);
  }
  const total = (v: number[]) => v.reduce((a, b) => a + b, 0);
  const layers = [...byTeam]
    .map(([label, values]) => ({ label, values }))
    .filter((l) => total(l.values) > 0)
    .sort((a, b) => total(b.values) - total(a.values) || a.label.localeCompare(b.label));
  if (layers.length <= CHART_TEAMS + 1) return { bounds, layers };
  const rest = layers.slice(CHART_TEAMS);
  const other = { label: `${rest.length} other ${others}`, values: sorted.map((_, i) => rest.reduce((a, l) => a + l.values[i], 0)) };
  return { bounds, layers: [...layers.slice(0, CHART_TEAMS), other] };
}

/// The report's teams in tree order (parents first, siblings by name) with their depth; a
/// team whose parent is not shown is a root.
export function teamTree(teams: TeamUsage[]): { team: TeamUsage; depth: number }[] {
  const names = new Set(teams.map((t) => t.team));
  const children = new Map<string | null, TeamUsage[]>();
  for (const t of teams) {
    const parent = t.parent && names.has(t.parent) ? t.parent : null;
    children.set(parent, [...(children.get(parent) ?? []), t]);
  }
  const out: { team: TeamUsage; depth: number }[] = [];
  const walk = (parent: string | null, depth: number) => {
    for (const t of (children.get(parent) ?? []).sort((a, b) => a.team.localeCompare(b.team))) {
      out.push({ team: t, depth });
      walk(t.team, depth + 1);
    }
  };
  walk(null, 0);
  return out;
}

/// Owners by GPU-hours over every team they ran work in, the largest first.
export function topConsumers(rows: UsageRow[], count: number) {
  type Consumer = { owner: string; gpu_hours: number; cost: number; unpriced_gpu_hours: number; teams: Set<string> };
  const owners = new Map<string, Consumer>();
  for (const r of rows) {
    const owner = r.owner ?? "";
    const o = owners.get(owner) ?? { owner, gpu_hours: 0, cost: 0, unpriced_gpu_hours: 0, teams: new Set<string>() };
    o.gpu_hours += r.gpu_hours;
    o.cost += r.cost;
    o.unpriced_gpu_hours += r.unpriced_gpu_hours;
    if (r.team) o.teams.add(r.team);
    owners.set(owner, o);
  }
  return [...owners.values()]
    .filter((o) => o.gpu_hours > 0)
    .sort((a, b) => b.gpu_hours - a.gpu_hours || a.owner.localeCompare(b.owner))
    .slice(0, count);
}

function ownerName(owner: string | null | undefined) {
  return owner ? owner : <span class="muted">(not recorded)</span>;
}

interface ReportData {
  /// The period and bucket these answer, so an older answer is never shown for a newer choice.
  key: string;
  byOwner: UsageReport;
  byTime: UsageReport;
  teams: Team[];
}

async function load(from: string, to: string, bucket: ReportBucket): Promise<ReportData | null> {
  if (from > to) return null;
  const period = instants(from, to);
  const [byOwner, byTime, teams] = await Promise.all([
    api<UsageReport>(reportPath({ ...period, group_by: ["team", "owner"] })),
    api<UsageReport>(reportPath({ ...period, group_by: ["team"], bucket })),
    all<Team>("/api/v1/teams"),
  ]);
  return { key: `${from}/${to}/${bucket}`, byOwner, byTime, teams };
}

/// Usage reports: GPU-hours and cost over a period of whole UTC days, by department, team
/// and owner, over time, the top consumers, idle guarantees, and each team's budgets; the
/// period as CSV.
export function Reports() {
  const params = new URLSearchParams(location.hash.split("?")[1] ?? "");
  const initial = PRESETS[2].range();
  const [from, setFrom] = useState(isDay(params.get("from")) ? params.get("from")! : initial.from);
  const [to, setTo] = useState(isDay(params.get("to")) ? params.get("to")! : initial.to);
  const asked = params.get("bucket") as ReportBucket;
  const [bucket, setBucket] = useState<ReportBucket>(BUCKETS.includes(asked) ? asked : "day");
  const [data, error] = usePoll(() => load(from, to, bucket), [from, to, bucket], 60_000);
  const [problem, setProblem] = useState<string | null>(null);
  const [downloading, setDownloading] = useState(false);
  // The address keeps the choice, for a reload or a link (without reloading the page).
  useEffect(() => {
    history.replaceState(null, "", `#/reports?${new URLSearchParams({ from, to, bucket })}`);
  }, [from, to, bucket]);
  const valid = from <= to;
  const current = data && data.key === `${from}/${to}/${bucket}` ? data : null;
  const filename = `berth-usage-${from}-${to}.csv`;
  const download = async () => {
    setProblem(null);
    setDownloading(true);
    try {
      const path = reportPath({ ...instants(from, to), group_by: ["team", "owner"], bucket, format: "csv" });
      const url = URL.createObjectURL(await apiBlob(path, "text/csv"));
      const a = document.createElement("a");
      a.href = url;
      a.download = filename;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    } catch (e) {
      setProblem(e instanceof ApiError ? e.message : String(e));
    } finally {
      setDownloading(false);
    }
  };
  return (
    <>
      <h1>Reports</h1>
      <form class="filters period" onSubmit={(e) => e.preventDefault()}>
        <span>
          <label for="report-from">From</label>{" "}
          <input id="report-from" type="date" value={from} max={to} required onChange={(e) => isDay(e.currentTarget.value) && setFrom(e.currentTarget.value)} />
        </span>
        <span>
          <label for="report-to">To</label>{" "}
          <input id="report-to" type="date" value={to} min={from} required onChange={(e) => isDay(e.currentTarget.value) && setTo(e.currentTarget.value)} />
        </span>
        <span>
          <label for="report-bucket">Per</label>{" "}
          <select id="report-bucket" value={bucket} onChange={(e) => setBucket(e.currentTarget.value as ReportBucket)}>
            {BUCKETS.map((b) => (
              <option value={b}>{b}</option>
            ))}
          </select>
        </span>
        <div class="actions">
          {PRESETS.map((p) => {
            const r = p.range();
            return (
              <button
                type="button"
                aria-pressed={r.from === from && r.to === to}
                onClick={() => {
                  setFrom(r.from);
                  setTo(r.to);
                }}
              >
                {p.label}
              </button>
            );
          })}
          <button type="button" disabled={!valid || downloading} onClick={download}>
            Download CSV
          </button>
        </div>
      </form>
      <p class="muted">
        Whole days in UTC, {from} to {to} included; work still running counts up to now.
      </p>
      {!valid && (
        <p class="error" role="alert">
          The period starts after it ends.
        </p>
      )}
      {problem && (
        <p class="error" role="alert">
          {problem}
        </p>
      )}
      {error && (
        <p class="error" role="alert">
          {current ? "Not refreshed: " : ""}
          {error.message}
        </p>
      )}
      {valid && !current && !error && <p class="loading">Loading…</p>}
      {valid && current && <Report data={current} bucket={bucket} />}
    </>
  );
}

function Report({ data, bucket }: { data: ReportData; bucket: ReportBucket }) {
  const { byOwner, byTime, teams } = data;
  const t = byOwner.totals;
  const { bounds, layers } = teamLayers(byTime, bucket);
  const top = topConsumers(byOwner.rows, TOP_CONSUMERS);
  // Guarantees the caller may not see (a member's team with teams below it) are absent.
  const idle = byOwner.teams
    .flatMap((u) =>
      (u.guaranteed_gpu_hours ?? 0) > 0
        ? [{ team: u.team, guaranteed: u.guaranteed_gpu_hours ?? 0, idle: u.idle_guarantee_gpu_hours ?? 0 }]
        : [],
    )
    .sort((a, b) => b.idle - a.idle || a.team.localeCompare(b.team));
  const budgets = teams
    .filter((team) => (team.spec.budgets ?? []).length > 0 || (team.status.budgets ?? []).length > 0)
    .sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  const owners = (team: string) =>
    byOwner.rows.filter((r) => r.team === team).sort((a, b) => b.gpu_hours - a.gpu_hours || (a.owner ?? "").localeCompare(b.owner ?? ""));
  const card = (id: string, title: string, value: string, note: string) => (
    <div class="card">
      <div class="card-title">{title}</div>
      <div class="big" data-testid={`report-total-${id}`}>
        {value}
      </div>
      <div class="muted">{note}</div>
    </div>
  );
  return (
    <>
      <section aria-labelledby="totals-heading" class="cards">
        <h2 id="totals-heading" class="visually-hidden">
          Totals
        </h2>
        {card("gpu-hours", "GPU-hours", hours(t.gpu_hours), "in the period")}
        {card(
          "cost",
          "Cost",
          money(t.cost),
          t.unpriced_gpu_hours > 0
            ? `GPU-hours at their flavor's price; not ${hours(t.unpriced_gpu_hours)} of flavors without one`
            : "GPU-hours at their flavor's price",
        )}
        {card("in-quota-gpu-hours", "In quota", hours(t.in_quota_gpu_hours), `GPU-hours within guarantees (${percent(t.in_quota_gpu_hours, t.gpu_hours)})`)}
        {card("borrowed-gpu-hours", "Borrowed", hours(t.borrowed_gpu_hours), `GPU-hours beyond guarantees (${percent(t.borrowed_gpu_hours, t.gpu_hours)})`)}
      </section>

      <section aria-labelledby="breakdown-heading">
        <h2 id="breakdown-heading">By department, team and owner</h2>
        {byOwner.teams.length === 0 ? (
          <p class="muted">No team used GPUs in this period.</p>
        ) : (
          <table class="report">
            <thead>
              <tr>
                <th scope="col">Department / team / owner</th>
                <th scope="col" class="num">GPU-hours</th>
                <th scope="col" class="num">Cost</th>
                <th scope="col" class="num">In quota</th>
                <th scope="col" class="num">Borrowed</th>
                <th scope="col" class="num">Share</th>
              </tr>
            </thead>
            <tbody>
              {teamTree(byOwner.teams).flatMap(({ team: u, depth }) => [
                <tr data-team={u.team} class={depth === 0 ? "department" : undefined}>
                  <th scope="row" style={{ paddingLeft: `${0.6 + depth * 1.2}rem` }}>
                    {u.team}
                    {u.own.gpu_hours > 0 && u.own.gpu_hours !== u.subtree.gpu_hours && (
                      <span class="muted" title="its own workloads; the figures count the teams below it too">
                        {" "}
                        (own {hours(u.own.gpu_hours)})
                      </span>
                    )}
                  </th>
                  <td class="num">{hours(u.subtree.gpu_hours)}</td>
                  <td class="num"><Cost of={u.subtree} /></td>
                  <td class="num">{hours(u.subtree.in_quota_gpu_hours)}</td>
                  <td class="num">{hours(u.subtree.borrowed_gpu_hours)}</td>
                  <td class="num">{percent(u.subtree.gpu_hours, t.gpu_hours)}</td>
                </tr>,
                ...owners(u.team).map((r) => (
                  <tr data-owner={`${u.team}/${r.owner ?? ""}`} class="owner">
                    <td style={{ paddingLeft: `${0.6 + (depth + 1) * 1.2}rem` }}>{ownerName(r.owner)}</td>
                    <td class="num">{hours(r.gpu_hours)}</td>
                    <td class="num"><Cost of={r} /></td>
                    <td class="num">{hours(r.in_quota_gpu_hours)}</td>
                    <td class="num">{hours(r.borrowed_gpu_hours)}</td>
                    <td class="num">{percent(r.gpu_hours, t.gpu_hours)}</td>
                  </tr>
                )),
              ])}
            </tbody>
          </table>
        )}
      </section>

      <section aria-labelledby="over-time-heading">
        <h2 id="over-time-heading">GPU-hours per team, per {bucket}</h2>
        <StackedChart
          bounds={bounds}
          layers={layers}
          label={`GPU-hours per team and ${bucket}, stacked`}
          unit="GPU-hours"
          format={(v) => (Math.abs(v) >= 100 ? String(Math.round(v)) : hours(v))}
          when={bucketLabel(bucket)}
        />
      </section>

      <section aria-labelledby="top-heading">
        <h2 id="top-heading">Top consumers</h2>
        {top.length === 0 ? (
          <p class="muted">Nobody used GPUs in this period.</p>
        ) : (
          <table class="top">
            <thead>
              <tr>
                <th scope="col" class="num">#</th>
                <th scope="col">Owner</th>
                <th scope="col">Teams</th>
                <th scope="col" class="num">GPU-hours</th>
                <th scope="col" class="num">Cost</th>
                <th scope="col" class="num">Share</th>
              </tr>
            </thead>
            <tbody>
              {top.map((o, i) => (
                <tr data-consumer={o.owner}>
                  <td class="num">{i + 1}</td>
                  <td>{ownerName(o.owner)}</td>
                  <td>{[...o.teams].sort().join(", ")}</td>
                  <td class="num">{hours(o.gpu_hours)}</td>
                  <td class="num"><Cost of={o} /></td>
                  <td class="num">{percent(o.gpu_hours, t.gpu_hours)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </section>

      <section aria-labelledby="idle-heading">
        <h2 id="idle-heading">Idle guarantees</h2>
        {idle.length === 0 ? (
          <p class="muted">
            {byOwner.teams.some((u) => u.guaranteed_gpu_hours === undefined)
              ? "No team whose teams below you all may read had a guarantee in this period (how much of a department's guarantee lay idle depends on work you may not read)."
              : "No team had a guarantee in this period."}
          </p>
        ) : (
          <>
            <p class="muted">GPU-hours a team's guarantees stood for (since it exists, up to now) that its subtree left unused.</p>
            <table class="idle">
              <thead>
                <tr>
                  <th scope="col">Team</th>
                  <th scope="col" class="num">Guaranteed GPU-hours</th>
                  <th scope="col" class="num">Idle GPU-hours</th>
                  <th scope="col" class="num">Idle</th>
                </tr>
              </thead>
              <tbody>
                {idle.map((u) => (
                  <tr data-idle-team={u.team}>
                    <th scope="row">{u.team}</th>
                    <td class="num">{hours(u.guaranteed)}</td>
                    <td class="num">{hours(u.idle)}</td>
                    <td class="num">{percent(u.idle, u.guaranteed)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </>
        )}
      </section>

      <section aria-labelledby="budgets-heading">
        <h2 id="budgets-heading">Budgets</h2>
        {budgets.length === 0 ? (
          <p class="muted">
            No team you may read has a budget. (An ancestor team's budget that stops your work is named in its pending
            reason.)
          </p>
        ) : (
          <>
            <p class="muted">Each budget's current period, whatever period the report above covers.</p>
            <ul class="budgets">
              {budgets.flatMap((team) => budgetsOf(team).map(([budget, status], i) => <BudgetBar team={team.metadata.name} index={i} budget={budget} status={status} />))}
            </ul>
          </>
        )}
      </section>
    </>
  );
}

const ACTIONS: Record<BudgetAction, string> = {
  warn: "warns only",
  stop_borrowing: "then no borrowing",
  stop_new: "then no new work",
};

/// A team's budgets as declared, each with its status where Berth has added it up since
/// (the status follows the spec in order; a budget changed or added meanwhile has none yet).
function budgetsOf(team: Team): [Budget, BudgetStatus | undefined][] {
  const status = team.status.budgets ?? [];
  const same = (a: Budget, b: Budget) =>
    (a.flavor ?? null) === (b.flavor ?? null) && a.gpu_hours === b.gpu_hours && a.period === b.period && a.action === b.action;
  const spec = team.spec.budgets ?? status.map((s) => s.budget);
  return spec.map((b, i) => [b, status[i] && same(status[i].budget, b) ? status[i] : undefined]);
}

/// A budget's use in its period: a bar coloured by its state, the action and the reset.
function BudgetBar({ team, index, budget, status: s }: { team: string; index: number; budget: Budget; status?: BudgetStatus }) {
  const what = `${budget.flavor ?? "all flavors"} per ${budget.period}`;
  if (!s)
    return (
      <li class="budget" data-budget={`${team}/${index}`}>
        <div class="budget-head">
          <strong>{team}</strong> <span class="muted">{what}</span>
        </div>
        <div class="muted">
          {hours(budget.gpu_hours)} GPU-hours · action: {budget.action ?? "warn"} ({ACTIONS[budget.action ?? "warn"]}) · not added up yet
        </div>
      </li>
    );
  const allowed = s.budget.gpu_hours;
  const share = allowed > 0 ? Math.min(1, s.used_gpu_hours / allowed) : s.used_gpu_hours > 0 ? 1 : 0;
  return (
    <li class="budget" data-budget={`${team}/${index}`} data-state={s.state}>
      <div class="budget-head">
        <strong>{team}</strong> <span class="muted">{what}</span> <span class={`badge ${s.state}`}>{s.state}</span>
      </div>
      <div
        class="bar"
        role="meter"
        aria-label={`${team}: ${what}`}
        aria-valuemin={0}
        aria-valuemax={allowed}
        aria-valuenow={Math.min(s.used_gpu_hours, allowed)}
        aria-valuetext={`${hours(s.used_gpu_hours)} of ${hours(allowed)} GPU-hours`}
      >
        <div class={`fill ${s.state}`} style={{ width: `${(share * 100).toFixed(1)}%` }} />
      </div>
      <div class="muted">
        <span data-testid="budget-used">{hours(s.used_gpu_hours)}</span> of {hours(allowed)} GPU-hours ({percent(s.used_gpu_hours, allowed)}) ·
        action: {s.budget.action ?? "warn"} ({ACTIONS[s.budget.action ?? "warn"]}) · resets{" "}
        <time dateTime={s.resets_at}>{new Date(s.resets_at).toLocaleString()}</time>
      </div>
    </li>
  );
}
