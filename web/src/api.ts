// The Berth API as the dashboard uses it: a bearer token kept in this tab, JSON in and
// out, RFC 9457 problems turned into errors that keep their field.

import type { components } from "./openapi";
import { refreshSession } from "./oidc";

const SESSION_KEY = "berth.session";

/// The tab's sign-in: a bearer token and, for a token from the identity provider, how to
/// refresh it. Kept in sessionStorage (this tab only, gone when it closes), never in
/// localStorage where every tab and script of the origin would find it for good.
export interface Session {
  token: string;
  /// The provider's refresh token, token endpoint and client, and when `token` expires
  /// (ms since the epoch).
  refresh?: { token: string; endpoint: string; client_id: string; expires_at: number };
}

export function session(): Session | null {
  try {
    return JSON.parse(sessionStorage.getItem(SESSION_KEY) ?? "null");
  } catch {
    return null;
  }
}

export function saveSession(s: Session | null) {
  if (s) sessionStorage.setItem(SESSION_KEY, JSON.stringify(s));
  else sessionStorage.removeItem(SESSION_KEY);
}

export function savedToken(): string | null {
  return session()?.token ?? null;
}

/// Signs in with one of Berth's own tokens (pasted), or out (`null`).
export function saveToken(token: string | null) {
  saveSession(token ? { token } : null);
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

  /// What was thrown, as an ApiError (anything else is status 0).
  static of(e: unknown): ApiError {
    return e instanceof ApiError ? e : new ApiError(0, "Error", String(e));
  }
}

interface Problem {
  title?: string;
  detail?: string;
  errors?: FieldError[];
}

/// `fetch` with the tab's token; a 401 with a refreshable session refreshes it once and
/// asks again (a sleeping laptop misses the timed refresh).
async function authorized(path: string, init: RequestInit & { headers: Record<string, string> }): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    const token = savedToken();
    if (token) init.headers.Authorization = `Bearer ${token}`;
    let response: Response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "Berth did not answer", `Berth did not answer (${e instanceof Error ? e.message : e})`);
    }
    if (response.status !== 401 || attempt > 0 || !session()?.refresh || !(await refreshSession().catch(() => false)))
      return response;
  }
}

export async function api<T>(
  path: string,
  init: { method?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json", ...init.headers };
  if (init.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await authorized(path, {
    method: init.method ?? "GET",
    headers,
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
  });
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
  const response = await authorized(path, { headers: { Accept: `${accept}, application/problem+json` } });
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
    cursor = page.next ?? null;
  } while (cursor);
  return items;
}

export interface Page<T> {
  items: T[];
  next?: string | null;
}

// The API's objects, as its OpenAPI document describes them (src/openapi.d.ts is generated
// from openapi/openapi.json by scripts/openapi; the build fails when it is out of date).
type Schemas = components["schemas"];
export type FieldError = Schemas["FieldError"];
export type Meta = Schemas["ObjectMeta"];
export type Grant = Schemas["Grant"];
export type Me = Schemas["Principal"];
export type InventoryEntry = Schemas["InventoryEntry"];
export type Cluster = Schemas["Cluster"];
export type Quota = Schemas["Quota"];
export type FlavorUsage = Schemas["FlavorUsage"];
export type Budget = Schemas["Budget"];
export type BudgetAction = Schemas["BudgetAction"];
export type BudgetStatus = Schemas["BudgetStatus"];
export type Team = Schemas["Team"];
export type Flavor = Schemas["Flavor"];
export type GroupBy = Schemas["GroupBy"];
export type ReportBucket = Schemas["Bucket"];
export type UsageAmounts = Schemas["UsageAmounts"];
export type UsageRow = Schemas["UsageRow"];
export type TeamUsage = Schemas["TeamUsage"];
export type UsageReport = Schemas["UsageReport"];
export type PreviewWorkload = Schemas["PreviewWorkload"];
export type QuotaPreview = Schemas["QuotaPreview"];
export type Phase = Schemas["Phase"];
export type Workload = Schemas["Workload"];
export type WorkloadEvent = Schemas["Event"];
export type Queue = Schemas["Queue"];
export type WorkloadSummary = Schemas["WorkloadSummary"];
export type NodeView = Schemas["NodeView"];
export type AuditRecord = Schemas["AuditRecord"];
export type AuditList = Schemas["AuditList"];
export type LoginConfig = Schemas["LoginConfig"];
export type Role = Schemas["Role"];
export type RoleBindingList = Schemas["RoleBindingList"];
export type ServiceAccount = Schemas["ServiceAccount"];
export type ServiceAccountList = Schemas["ServiceAccountList"];
export type TokenList = Schemas["TokenList"];
export type CreatedToken = Schemas["CreatedToken"];
export type OidcLogin = Schemas["OidcLogin"];

/// What the signed-in principal may do, as far as the dashboard shows controls for it (the
/// API decides in the end).
export function abilities(me: Me) {
  const global = (role: Grant["role"]) => me.grants.some((g) => g.role === role && !g.team);
  return {
    platformAdmin: global("platform-admin"),
    /// The audit log is for platform admins and global viewers.
    readsAudit: global("platform-admin") || global("viewer"),
    /// Teams whose subtree the principal administers.
    adminOf: me.grants.filter((g) => g.role === "team-admin" && g.team).map((g) => g.team as string),
    /// Roles and service accounts are managed by platform admins and team admins.
    managesAccess: global("platform-admin") || me.grants.some((g) => g.role === "team-admin" && g.team),
  };
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

/// Every phase, in the order a workload moves through them.
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
] as const satisfies readonly Phase[];

export function gpusOf(w: Workload): number {
  return w.spec.tasks.count * w.spec.tasks.resources.gpus;
}

/// Deletes the object at `path`, conditionally on its spec being `seen`: Berth's own status
/// writes move an object's version, so a refused delete (412) is read again and retried
/// while the spec is still the one the user saw. (The Teams page sent the version of a list
/// up to 5 s old and showed "If-Match does not match the current resource version".)
export async function deleteSeen<S>(path: string, seen: S): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const current = await api<{ metadata: Meta; spec: S }>(path);
    if (JSON.stringify(current.spec) !== JSON.stringify(seen))
      throw new ApiError(409, "Changed meanwhile", "Someone else changed this since you saw it; look again before deleting.");
    try {
      await api(path, { method: "DELETE", headers: { "If-Match": `"${current.metadata.resource_version}"` } });
      return;
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 412 || attempt >= 4) throw e;
    }
  }
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
