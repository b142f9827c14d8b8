// The Berth API as the dashboard uses it: a bearer token kept in this browser, JSON in and
// out, RFC 9457 problems turned into errors that keep their field.

const TOKEN_KEY = "berth.token";

export function savedToken(): string | null {
  return localStorage.getItem(TOKEN_KEY);
}

export function saveToken(token: string | null) {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
}

/// A problem the API answered (RFC 9457), or a network failure (status 0).
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly title: string,
    readonly detail: string,
    /// Each broken rule with its field (a JSON pointer into the body, or a parameter).
    readonly errors: FieldError[] = [],
  ) {
    super(detail || title);
  }

  /// The message for one field, if the API named it.
  about(field: string): string | undefined {
    return this.errors.find((e) => e.field === field)?.message;
  }
}

export interface FieldError {
  field: string;
  message: string;
}

interface Problem {
  title?: string;
  detail?: string;
  errors?: FieldError[];
}

export async function api<T>(path: string, init: { method?: string; body?: unknown } = {}): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  const token = savedToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (init.body !== undefined) headers["Content-Type"] = "application/json";
  let response: Response;
  try {
    response = await fetch(path, {
      method: init.method ?? "GET",
      headers,
      body: init.body === undefined ? undefined : JSON.stringify(init.body),
    });
  } catch (e) {
    throw new ApiError(0, "Berth did not answer", String(e));
  }
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const p: Problem = body ?? {};
    throw new ApiError(response.status, p.title ?? response.statusText, p.detail ?? "", p.errors ?? []);
  }
  return body as T;
}

/// A plain-text answer (a workload's logs); problems as [`api`] reports them.
export async function apiText(path: string): Promise<string> {
  return (await fetchOk(path, "text/plain")).text();
}

/// A file to save (a report as CSV), of the type `accept` names; problems as [`api`]
/// reports them.
export async function apiBlob(path: string, accept: string): Promise<Blob> {
  return (await fetchOk(path, accept)).blob();
}

/// A successful answer of type `accept`, its body unread.
async function fetchOk(path: string, accept: string): Promise<Response> {
  const headers: Record<string, string> = { Accept: `${accept}, application/problem+json` };
  const token = savedToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let response: Response;
  try {
    response = await fetch(path, { headers });
  } catch (e) {
    throw new ApiError(0, "Berth did not answer", String(e));
  }
  if (!response.ok) {
    const text = await response.text();
    let p: Problem = {};
    try {
      p = JSON.parse(text);
    } catch {
      p = { detail: text };
    }
    throw new ApiError(response.status, p.title ?? response.statusText, p.detail ?? "", p.errors ?? []);
  }
  return response;
}

/// Every item of a paged list.
export async function all<T>(path: string): Promise<T[]> {
  const items: T[] = [];
  let cursor: string | null = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page: Page<T> = await api(`${path}${sep}limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    cursor = page.next;
  } while (cursor);
  return items;
}

export interface Page<T> {
  items: T[];
  next: string | null;
}

export interface Meta {
  name: string;
  team?: string;
  uid: string;
  /// Workloads: who submitted it.
  owner?: { subject: string; issuer: string };
  resource_version: string;
  labels?: Record<string, string>;
  created_at?: string;
}

export interface Grant {
  role: "platform-admin" | "team-admin" | "member" | "viewer";
  team?: string | null;
}

export interface Me {
  subject: string;
  grants: Grant[];
}

/// What the signed-in principal may do, as far as the dashboard shows controls for it (the
/// API decides in the end).
export function abilities(me: Me) {
  const global = (role: Grant["role"]) => me.grants.some((g) => g.role === role && !g.team);
  return {
    platformAdmin: global("platform-admin"),
    /// Teams whose subtree the principal administers.
    adminOf: me.grants.filter((g) => g.role === "team-admin" && g.team).map((g) => g.team as string),
  };
}

export interface InventoryEntry {
  flavor: string;
  nodes: number;
  gpus_total: number;
  gpus_free: number;
}

export interface Cluster {
  metadata: Meta;
  spec: { kind: string; cordoned?: boolean; [k: string]: unknown };
  status: {
    health: string;
    last_sync?: string;
    message?: string;
    inventory: InventoryEntry[];
  };
}

export interface Quota {
  flavor: string;
  guaranteed: number;
  limit?: number | null;
  weight: number;
}

/** A team's use of a flavor: its own workloads', and its subtree's (the team and every team below it). */
export interface FlavorUsage {
  flavor: string;
  allocated: number;
  borrowed: number;
  fair_share: number;
  subtree_allocated: number;
  subtree_borrowed: number;
  subtree_fair_share: number;
}

/// GPU-hours a team's subtree may use per week or month, of one flavor or of all.
export interface Budget {
  flavor?: string | null;
  gpu_hours: number;
  period: "week" | "month";
  action: "warn" | "stop_borrowing" | "stop_new";
}

/// A budget's use in its current period.
export interface BudgetStatus {
  budget: Budget;
  used_gpu_hours: number;
  state: "ok" | "warning" | "exhausted";
  period_start: string;
  resets_at: string;
  updated_at: string;
}

export interface Team {
  metadata: Meta;
  spec: { parent?: string | null; description?: string | null; quotas: Quota[]; budgets?: Budget[] };
  status: { usage: FlavorUsage[]; budgets?: BudgetStatus[] };
}

export interface UsageHistory {
  since: string;
  series: { team: string; flavor: string; points: { at: string; allocated: number; borrowed: number }[] }[];
}

export type GroupBy = "team" | "owner" | "flavor" | "cluster" | "kind" | "backend";
export type ReportBucket = "hour" | "day" | "week" | "month";

/// GPU-hours (within the guarantee and borrowed beyond it) and their cost.
export interface UsageAmounts {
  gpu_hours: number;
  in_quota_gpu_hours: number;
  borrowed_gpu_hours: number;
  cost: number;
}

/// A report's row: its bucket (when bucketed) and the values of the dimensions it was
/// grouped by; the others are absent.
export interface UsageRow extends UsageAmounts {
  bucket?: string;
  team?: string;
  /// "" for work from before owners were recorded.
  owner?: string;
  flavor?: string;
  cluster?: string;
  kind?: string;
  backend?: string;
}

/// A team's totals in a report: its own workloads', and its subtree's.
export interface TeamUsage {
  team: string;
  /// Absent for a top-level team (a department).
  parent?: string | null;
  own: UsageAmounts;
  subtree: UsageAmounts;
  guaranteed_gpu_hours: number;
  idle_guarantee_gpu_hours: number;
}

export interface UsageReport {
  from: string;
  to: string;
  bucket?: ReportBucket;
  group_by: GroupBy[];
  totals: UsageAmounts;
  rows: UsageRow[];
  /// Every team with usage or a guarantee in the period.
  teams: TeamUsage[];
}

/// The path of a usage report over `[from, to)` (RFC 3339; the API's defaults when absent).
export function reportPath(q: {
  from?: string;
  to?: string;
  group_by?: GroupBy[];
  bucket?: ReportBucket;
  format?: "csv";
}): string {
  const query = new URLSearchParams();
  if (q.from) query.set("from", q.from);
  if (q.to) query.set("to", q.to);
  if (q.group_by?.length) query.set("group_by", q.group_by.join(","));
  if (q.bucket) query.set("bucket", q.bucket);
  if (q.format) query.set("format", q.format);
  const s = query.toString();
  return `/api/v1/usage/report${s ? `?${s}` : ""}`;
}

export interface PreviewWorkload {
  team?: string | null;
  name?: string | null;
  gpus: number;
}

export interface QuotaPreview {
  summary: string[];
  admitted: PreviewWorkload[];
  no_longer_admitted: PreviewWorkload[];
  preempted: PreviewWorkload[];
  no_longer_preempted: PreviewWorkload[];
  fair_shares: { team: string; flavor: string; before: number; after: number }[];
}

export const PHASES = [
  "Pending",
  "Admitted",
  "Dispatched",
  "Running",
  "Preempting",
  "Unknown",
  "Succeeded",
  "Failed",
  "Cancelled",
] as const;

export interface Workload {
  metadata: Meta & { team: string; deletion_timestamp?: string };
  spec: {
    kind: string;
    priority?: number;
    preemptible?: boolean;
    tasks: { count: number; resources: { flavors: string[]; gpus: number; cpus?: number; memory_mib?: number } };
    [k: string]: unknown;
  };
  status: {
    phase: (typeof PHASES)[number];
    attempt: number;
    submitted_at?: string;
    admission?: { cluster: string; flavor: string; borrowed: boolean };
    backend_ref?: { cluster: string; job_id: string; output?: string };
    pending_reason?: { code: string; message: string };
    queue_position?: { global: number; team: number };
    /// While pending: when it should start, and why then.
    estimated_start?: { at: string; basis: string };
    /// Set once someone cancelled it.
    cancellation?: { requested_at: string; by: string };
    started_at?: string;
    finished_at?: string;
    exit_code?: number;
    reason?: string;
    message?: string;
  };
}

export interface WorkloadEvent {
  id: number;
  type: "Normal" | "Warning";
  reason: string;
  message: string;
  time: string;
}

export function gpusOf(w: Workload): number {
  return w.spec.tasks.count * w.spec.tasks.resources.gpus;
}

export interface Queue {
  total: number;
  gpus: number;
  items: Workload[];
}

export interface WorkloadSummary {
  phases: { phase: (typeof PHASES)[number]; workloads: number; gpus: number }[];
}

export interface NodeView {
  name: string;
  flavor?: string | null;
  block?: string | null;
  gpus: number;
  unavailable_gpus: number;
  allocated_gpus: number;
  schedulable: boolean;
}

/// Replaces the spec of the object at `path` with `change(spec)`, conditionally on the
/// version it read. Berth's own status writes also move an object's version, so a refused
/// write (409, 412) is read again and retried, as long as the spec is still the one the
/// user saw (`seen`, when given); a spec someone else changed is reported instead.
export async function updateSpec<S>(
  path: string,
  change: (spec: S) => S,
  seen?: S,
): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const current = await api<{ metadata: Meta; spec: S }>(path);
    if (seen !== undefined && JSON.stringify(current.spec) !== JSON.stringify(seen))
      throw new ApiError(409, "Changed meanwhile", "Someone else changed this since you opened it; reload and edit again.");
    try {
      await api(path, {
        method: "PUT",
        body: {
          metadata: { labels: current.metadata.labels ?? {}, resource_version: current.metadata.resource_version },
          spec: change(current.spec),
        },
      });
      return;
    } catch (e) {
      if (!(e instanceof ApiError) || (e.status !== 409 && e.status !== 412) || attempt >= 4) throw e;
    }
  }
}
