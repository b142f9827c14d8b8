import { useState } from "preact/hooks";
import { AuditList, AuditRecord, api } from "../api";
import { Pager, useCursors, usePoll } from "../app";

const KINDS = ["workload", "team", "cluster", "flavor"];

/// The periods offered, back from now, in hours.
const PERIODS: [string, number][] = [
  ["last hour", 1],
  ["last day", 24],
  ["last 7 days", 7 * 24],
  ["last 30 days", 30 * 24],
  ["last 90 days", 90 * 24],
];

/// Where the dashboard shows the object a record is about.
function objectLink(r: AuditRecord): string | undefined {
  if (r.kind === "workload" && r.team && r.verb !== "delete") return `#/workload/${r.team}/${r.name}`;
  if (r.kind === "team") return "#/teams";
  if (r.kind === "cluster") return "#/clusters";
  return undefined;
}

/// The spec's generation before and after the change ("—" where there was none).
function generations(r: AuditRecord): string {
  const g = (n?: number | null) => (n === undefined || n === null ? "—" : String(n));
  return `${g(r.generation_before)} → ${g(r.generation_after)}`;
}

/// Every leaf of `value` by its path (`quotas/0/guaranteed`); an empty object or array is a
/// leaf of its own.
function leaves(value: unknown, path = "", out = new Map<string, string>()): Map<string, string> {
  if (value !== null && typeof value === "object" && Object.keys(value).length > 0) {
    for (const [k, v] of Object.entries(value)) leaves(v, path ? `${path}/${k}` : k, out);
  } else if (path) {
    out.set(path, JSON.stringify(value));
  }
  return out;
}

/// What an update changed in the spec: each path whose value differs, before and after
/// ("—" where there was none).
export function specDiff(before: unknown, after: unknown): { path: string; before: string; after: string }[] {
  const [b, a] = [leaves(before), leaves(after)];
  const paths = [...new Set([...b.keys(), ...a.keys()])].sort();
  return paths.filter((p) => b.get(p) !== a.get(p)).map((p) => ({ path: p, before: b.get(p) ?? "—", after: a.get(p) ?? "—" }));
}

function SpecChange({ r }: { r: AuditRecord }) {
  if (r.spec_before === undefined || r.spec_after === undefined) return null;
  const diff = specDiff(r.spec_before, r.spec_after);
  return (
    <details>
      <summary>
        {diff.length} field{diff.length === 1 ? "" : "s"} changed
      </summary>
      <table class="diff">
        <thead>
          <tr>
            <th scope="col">Field</th>
            <th scope="col">Before</th>
            <th scope="col">After</th>
          </tr>
        </thead>
        <tbody>
          {diff.map((d) => (
            <tr data-path={d.path}>
              <td>
                <code>{d.path}</code>
              </td>
              <td>
                <code>{d.before}</code>
              </td>
              <td>
                <code>{d.after}</code>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </details>
  );
}

/// A search box applied when its text is entered (Enter or leaving it); what is typed
/// until then is kept across the page's refreshes.
function Typed({ onEnter }: { onEnter: (e: Event) => void }) {
  const [typed, setTyped] = useState("");
  return <input type="search" value={typed} onInput={(e) => setTyped(e.currentTarget.value)} onChange={onEnter} />;
}

/// The audit log (platform admins and global viewers): who changed what and when, newest
/// first, filtered by kind, object name, actor and period (applied by the API), 100 a page.
export function Audit() {
  const [kind, setKind] = useState("");
  const [name, setName] = useState("");
  const [actor, setActor] = useState("");
  const [hours, setHours] = useState("");
  const cursors = useCursors();
  const query = new URLSearchParams({ limit: "100" });
  if (kind) query.set("kind", kind);
  if (name) query.set("name", name);
  if (actor) query.set("actor", actor);
  if (hours) query.set("since", new Date(Date.now() - Number(hours) * 3600_000).toISOString());
  const cursor = cursors.cursor;
  if (cursor) query.set("cursor", cursor);
  const [page, error] = usePoll(() => api<AuditList>(`/api/v1/audit?${query}`), [kind, name, actor, hours, cursor]);
  const set = (to: (v: string) => void) => (e: Event) => {
    to((e.currentTarget as HTMLInputElement | HTMLSelectElement).value.trim());
    cursors.first();
  };
  return (
    <>
      <h1>Audit</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          Kind{" "}
          <select value={kind} onChange={set(setKind)}>
            <option value="">all</option>
            {KINDS.map((k) => (
              <option>{k}</option>
            ))}
          </select>
        </label>
        <label>
          Object name <Typed onEnter={set(setName)} />
        </label>
        <label>
          Actor <Typed onEnter={set(setActor)} />
        </label>
        <label>
          Period{" "}
          <select value={hours} onChange={set(setHours)}>
            <option value="">all kept</option>
            {PERIODS.map(([label, h]) => (
              <option value={String(h)}>{label}</option>
            ))}
          </select>
        </label>
      </form>
      {error && <p class="error" role="alert">{error.message}</p>}
      {!page ? (
        <p class="loading">Loading…</p>
      ) : (
        <>
          <table class="audit">
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Actor</th>
                <th scope="col">Change</th>
                <th scope="col">Object</th>
                <th scope="col">Generation</th>
                <th scope="col">Spec change</th>
                <th scope="col">Request</th>
              </tr>
            </thead>
            <tbody>
              {page.items.map((r) => {
                const object = `${r.kind} ${r.team ? `${r.team}/` : ""}${r.name}`;
                const link = objectLink(r);
                return (
                  <tr data-audit={r.id}>
                    <td>
                      <time dateTime={r.time}>{new Date(r.time).toLocaleString()}</time>
                    </td>
                    <td>{r.actor}</td>
                    <td>{r.verb}</td>
                    <td>{link ? <a href={link}>{object}</a> : object}</td>
                    <td>{generations(r)}</td>
                    <td>
                      <SpecChange r={r} />
                    </td>
                    <td class="muted">{r.request_id ?? ""}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
          {page.items.length === 0 && <p class="muted">No change matches.</p>}
          <Pager cursors={cursors} next={page.next} labels={["Newer", "Older"]} />
        </>
      )}
    </>
  );
}
