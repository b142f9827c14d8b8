import { useEffect, useState } from "preact/hooks";
import { ApiError, Me, PHASES, Page, Team, Workload, WorkloadEvent, abilities, all, api, apiText, gpusOf } from "../api";
import { Pager, useCursors, usePoll } from "../app";
import { fmt } from "./overview";

function when(t?: string | null): string {
  return t ? new Date(t).toLocaleString() : "";
}

/// A span of time, roughly: "45 s", "12 min", "3 h 5 min", "2 d 4 h".
export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
  return h % 24 ? `${Math.floor(h / 24)} d ${h % 24} h` : `${Math.floor(h / 24)} d`;
}

/// How long a workload waited to start: until now while it waits, until its start once
/// it started; `undefined` when it was never submitted or ended without starting.
function queued(w: Workload, now: number): number | undefined {
  const s = w.status;
  if (!s.submitted_at) return undefined;
  const until = s.started_at ? Date.parse(s.started_at) : FINAL.includes(s.phase) ? undefined : now;
  return until === undefined ? undefined : until - Date.parse(s.submitted_at);
}

function inQueue(w: Workload, now: number): string {
  const q = queued(w, now);
  return q === undefined ? "" : duration(q);
}

/// The table's columns: heading, and the value it sorts by.
const COLUMNS: [string, (w: Workload, now: number) => string | number | undefined][] = [
  ["Team", (w) => w.metadata.team ?? ""],
  ["Name", (w) => w.metadata.name],
  ["Owner", (w) => w.metadata.owner?.subject ?? ""],
  ["Kind", (w) => w.spec.kind],
  ["Phase", (w) => PHASES.indexOf(w.status.phase)],
  ["GPUs", (w) => gpusOf(w)],
  ["Cluster", (w) => w.status.admission?.cluster ?? ""],
  ["Submitted", (w) => w.status.submitted_at ?? ""],
  ["In queue", (w, now) => queued(w, now)],
  ["Estimated start", (w) => (w.status.phase === "Pending" ? w.status.estimated_start?.at : undefined)],
];

/// Orders `items` by column `by` (ascending, or descending), those without a value last.
function sorted(items: Workload[], by: number, descending: boolean, now: number): Workload[] {
  const key = COLUMNS[by][1];
  return [...items].sort((a, b) => {
    const [x, y] = [key(a, now), key(b, now)];
    if (x === undefined || y === undefined) return x === y ? 0 : x === undefined ? 1 : -1;
    const order = x < y ? -1 : x > y ? 1 : 0;
    return descending ? -order : order;
  });
}

/// The workloads table: filters by team, phase, kind and part of the name (applied by the
/// API), 100 a page; a column's heading sorts the page by it.
export function Workloads() {
  const params = new URLSearchParams(location.hash.split("?")[1] ?? "");
  const [team, setTeam] = useState(params.get("team") ?? "");
  const [phase, setPhase] = useState(params.get("phase") ?? "");
  const [kind, setKind] = useState(params.get("kind") ?? "");
  const [mine, setMine] = useState(params.get("owner") === "me");
  const [search, setSearch] = useState(params.get("name_contains") ?? "");
  const [sort, setSort] = useState<{ by: number; descending: boolean } | null>(null);
  const cursors = useCursors();
  const query = new URLSearchParams({ limit: "100" });
  if (team) query.set("team", team);
  if (phase) query.set("phase", phase);
  if (kind) query.set("kind", kind);
  if (mine) query.set("owner", "me");
  if (search) query.set("name_contains", search);
  const cursor = cursors.cursor;
  if (cursor) query.set("cursor", cursor);
  // The address keeps the filters, for Back from a workload's page, a reload or a link
  // (without reloading the page).
  useEffect(() => {
    const kept = new URLSearchParams();
    for (const [key, value] of [["team", team], ["phase", phase], ["kind", kind], ["owner", mine ? "me" : ""], ["name_contains", search]]) {
      if (value) kept.set(key, value);
    }
    const address = kept.toString() ? `#/workloads?${kept}` : "#/workloads";
    if (location.hash !== address) history.replaceState(null, "", address);
  }, [team, phase, kind, mine, search]);
  const [teams] = usePoll(() => all<Team>("/api/v1/teams"), [], 60000);
  const [page, error] = usePoll(() => api<Page<Workload>>(`/api/v1/workloads?${query}`), [team, phase, kind, mine, search, cursor]);
  const now = Date.now();
  const items = page && sort ? sorted(page.items, sort.by, sort.descending, now) : (page?.items ?? []);
  const filter = (set: (v: string) => void) => (e: Event) => {
    set((e.currentTarget as HTMLSelectElement).value);
    cursors.first();
  };
  return (
    <>
      <h1>Workloads</h1>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          Team{" "}
          <select value={team} onChange={filter(setTeam)}>
            <option value="">all</option>
            {(teams ?? []).map((t) => (
              <option>{t.metadata.name}</option>
            ))}
          </select>
        </label>
        <label>
          Phase{" "}
          <select value={phase} onChange={filter(setPhase)}>
            <option value="">all</option>
            {PHASES.map((p) => (
              <option>{p}</option>
            ))}
          </select>
        </label>
        <label>
          Kind{" "}
          <select value={kind} onChange={filter(setKind)}>
            <option value="">all</option>
            {["training", "batch", "inference", "notebook"].map((k) => (
              <option>{k}</option>
            ))}
          </select>
        </label>
        <label>
          <input
            type="checkbox"
            checked={mine}
            onChange={(e) => {
              setMine((e.currentTarget as HTMLInputElement).checked);
              cursors.first();
            }}
          />{" "}
          Mine only
        </label>
        <label>
          Name contains{" "}
          <input
            type="search"
            value={search}
            onInput={(e) => {
              setSearch((e.currentTarget as HTMLInputElement).value.trim().toLowerCase());
              cursors.first();
            }}
          />
        </label>
      </form>
      {error && <p class="error" role="alert">{error.message}</p>}
      {!page ? (
        <p class="loading">Loading…</p>
      ) : (
        <>
          <table class="workloads">
            <thead>
              <tr>
                {COLUMNS.map(([heading], i) => (
                  <th
                    scope="col"
                    class={heading === "GPUs" ? "num" : undefined}
                    aria-sort={sort?.by === i ? (sort.descending ? "descending" : "ascending") : undefined}
                  >
                    <button
                      type="button"
                      class="sort"
                      onClick={() => setSort({ by: i, descending: sort?.by === i && !sort.descending })}
                    >
                      {heading}
                      <span aria-hidden="true">{sort?.by === i ? (sort.descending ? " ▼" : " ▲") : ""}</span>
                    </button>
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {items.map((w) => (
                <tr data-workload={`${w.metadata.team}/${w.metadata.name}`}>
                  <td>{w.metadata.team}</td>
                  <td>
                    <a href={`#/workload/${w.metadata.team}/${w.metadata.name}`}>{w.metadata.name}</a>
                  </td>
                  <td>{w.metadata.owner?.subject ?? ""}</td>
                  <td>{w.spec.kind}</td>
                  <td>
                    <span class={`badge ${w.status.phase.toLowerCase()}`}>{w.status.phase}</span>
                  </td>
                  <td class="num">{fmt(gpusOf(w))}</td>
                  <td>{w.status.admission?.cluster ?? ""}</td>
                  <td>{when(w.status.submitted_at)}</td>
                  <td>{inQueue(w, now)}</td>
                  <td>{w.status.phase === "Pending" ? when(w.status.estimated_start?.at) : ""}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {page.items.length === 0 && <p class="muted">No workload matches.</p>}
          <Pager cursors={cursors} next={page.next} labels={["Previous page", "Next page"]} />
        </>
      )}
    </>
  );
}

const FINAL = ["Succeeded", "Failed", "Cancelled"];

/// `team` and the teams above it, as far as `teams` shows them. (Cancel was offered to an
/// admin of any team, and the API then refused an admin of another subtree.)
function teamAndAbove(team: string, teams: Team[]): string[] {
  const parent = new Map(teams.map((t) => [t.metadata.name, t.spec.parent ?? null]));
  const chain = [team];
  for (let next = parent.get(team); next && !chain.includes(next); next = parent.get(next)) chain.push(next);
  return chain;
}

/// One workload: status, where it runs, what it printed, its spec and its events; its
/// owner (or an admin) may cancel it.
export function WorkloadDetail({ me }: { me: Me }) {
  const [, , team, name] = location.hash.split("?")[0].split("/");
  const path = `/api/v1/teams/${team}/workloads/${name}`;
  const [data, error, reload] = usePoll(async () => {
    const [workload, events] = await Promise.all([
      api<Workload>(path),
      all<WorkloadEvent>(`${path}/events`),
    ]);
    return { workload, events };
  });
  const [cancelError, setCancelError] = useState<string | null>(null);
  // The teams the caller can see, to tell whether it administers this one or a team above it.
  const [teams] = usePoll(() => all<Team>("/api/v1/teams"), [], 60_000);
  if (!data) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const { workload: w, events } = data;
  const s = w.status;
  const estimate = s.estimated_start && `${when(s.estimated_start.at)} (${s.estimated_start.basis})`;
  const facts: [string, string | number | null | undefined][] = [
    ["Phase", s.phase],
    ["Owner", w.metadata.owner?.subject],
    ["Why", s.pending_reason?.message ?? s.message],
    ["Queue position", s.queue_position && `${s.queue_position.global} overall, ${s.queue_position.team} in the team`],
    ["Estimated start", s.phase === "Pending" ? (estimate ?? "not known: it waits for work without a runtime limit") : undefined],
    ["Cluster / flavor", s.admission && `${s.admission.cluster} / ${s.admission.flavor}${s.admission.borrowed ? " (borrowed)" : ""}`],
    ["Backend job", s.backend_ref && `${s.backend_ref.job_id} on ${s.backend_ref.cluster}`],
    ["GPUs", fmt(gpusOf(w))],
    ["Attempt", s.attempt],
    ["Submitted", when(s.submitted_at)],
    ["Started", when(s.started_at)],
    ["Finished", when(s.finished_at)],
    ["Cancelled by", s.cancellation && `${s.cancellation.by} at ${when(s.cancellation.requested_at)}`],
    ["Exit code", s.exit_code],
  ];
  const can = abilities(me);
  const mayCancel =
    !FINAL.includes(s.phase) &&
    !s.cancellation &&
    !w.metadata.deletion_timestamp &&
    (w.metadata.owner?.subject === me.subject ||
      can.platformAdmin ||
      teamAndAbove(team, teams ?? []).some((t) => can.adminOf.includes(t)));
  const cancel = async () => {
    if (!confirm(`Cancel ${team}/${name}? Its job is stopped; the workload and its history stay.`)) return;
    try {
      await api(`${path}/cancel`, { method: "POST" });
      setCancelError(null);
      reload();
    } catch (e) {
      setCancelError(e instanceof ApiError ? e.message : String(e));
    }
  };
  return (
    <>
      <h1>
        {team}/{name}
      </h1>
      {mayCancel && (
        <div class="actions">
          <button type="button" onClick={cancel}>
            Cancel workload
          </button>
        </div>
      )}
      {cancelError && <p class="error" role="alert">{cancelError}</p>}
      <dl class="facts">
        {facts
          .filter(([, v]) => v !== undefined && v !== null && v !== "")
          .map(([k, v]) => (
            <>
              <dt>{k}</dt>
              <dd data-fact={k}>{v}</dd>
            </>
          ))}
      </dl>
      <Logs path={path} live={!FINAL.includes(s.phase)} started={!!s.backend_ref || !!s.admission} />
      <h2>Events</h2>
      <ol class="timeline">
        {events.map((e) => (
          <li class={e.type === "Warning" ? "warning" : undefined}>
            <time dateTime={e.time}>{when(e.time)}</time> <strong>{e.reason}</strong> {e.message}
          </li>
        ))}
      </ol>
      <Run run={w.spec.run} />
      <h2>Spec</h2>
      <pre class="spec">{JSON.stringify(w.spec.run?.script ? { ...w.spec, run: { ...w.spec.run, script: "(above)" } } : w.spec, null, 2)}</pre>
    </>
  );
}

/// An argument as a POSIX shell reads it back (quoted where it has to be).
function shellQuote(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'"'"'`)}'`;
}

/// What the workload runs: its batch script as the lines it has, or its command as a shell
/// would read it; the image and environment.
function Run({ run }: { run?: Workload["spec"]["run"] }) {
  if (!run || (!run.script && !run.command?.length && !run.image)) return null;
  const env = Object.entries(run.env ?? {});
  return (
    <>
      <h2>Run</h2>
      {run.image && (
        <p>
          Image <code>{run.image}</code>
        </p>
      )}
      {run.script ? (
        <pre class="script" data-testid="script">
          {run.script}
        </pre>
      ) : (
        run.command?.length && (
          <pre class="script" data-testid="command">
            {run.command.map(shellQuote).join(" ")}
          </pre>
        )
      )}
      {env.length > 0 && (
        <dl class="facts" data-testid="env">
          {env.map(([k, v]) => (
            <>
              <dt>
                <code>{k}</code>
              </dt>
              <dd>
                <code>{v}</code>
              </dd>
            </>
          ))}
        </dl>
      )}
    </>
  );
}

/// The last 200 lines the workload's job printed (task 0), read again every 5 s while it
/// runs; where Berth cannot read them, the API's reason (and where they are).
function Logs({ path, live, started }: { path: string; live: boolean; started: boolean }) {
  const [text, error] = usePoll(
    () => (started ? apiText(`${path}/logs?tail=200`) : Promise.resolve("")),
    [started, live],
    live ? 5000 : 3_600_000,
  );
  return (
    <>
      <h2>Logs</h2>
      {!started ? (
        <p class="muted">No job{live ? " yet" : ""}: nothing printed.</p>
      ) : error ? (
        <p class="muted" data-testid="logs-unavailable">{error.message}</p>
      ) : (
        <pre class="logs" data-testid="logs">{text ?? "Loading…"}</pre>
      )}
    </>
  );
}
