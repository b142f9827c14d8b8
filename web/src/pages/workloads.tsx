import { useState } from "preact/hooks";
import { ApiError, Me, PHASES, Page, Team, Workload, WorkloadEvent, abilities, all, api, apiText, gpusOf } from "../api";
import { usePoll } from "../app";
import { fmt } from "./overview";

function when(t?: string | null): string {
  return t ? new Date(t).toLocaleString() : "";
}

/// The workloads table: filters by team, phase and kind (applied by the API), 100 a page.
export function Workloads() {
  const params = new URLSearchParams(location.hash.split("?")[1] ?? "");
  const [team, setTeam] = useState(params.get("team") ?? "");
  const [phase, setPhase] = useState(params.get("phase") ?? "");
  const [kind, setKind] = useState(params.get("kind") ?? "");
  const [mine, setMine] = useState(params.get("owner") === "me");
  const [pages, setPages] = useState<string[]>([]);
  const query = new URLSearchParams({ limit: "100" });
  if (team) query.set("team", team);
  if (phase) query.set("phase", phase);
  if (kind) query.set("kind", kind);
  if (mine) query.set("owner", "me");
  const cursor = pages[pages.length - 1];
  if (cursor) query.set("cursor", cursor);
  const [teams] = usePoll(() => all<Team>("/api/v1/teams"), [], 60000);
  const [page, error] = usePoll(() => api<Page<Workload>>(`/api/v1/workloads?${query}`), [team, phase, kind, mine, cursor]);
  const filter = (set: (v: string) => void) => (e: Event) => {
    set((e.currentTarget as HTMLSelectElement).value);
    setPages([]);
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
              setPages([]);
            }}
          />{" "}
          Mine only
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
                <th scope="col">Team</th>
                <th scope="col">Name</th>
                <th scope="col">Owner</th>
                <th scope="col">Kind</th>
                <th scope="col">Phase</th>
                <th scope="col" class="num">GPUs</th>
                <th scope="col">Cluster</th>
                <th scope="col">Submitted</th>
              </tr>
            </thead>
            <tbody>
              {page.items.map((w) => (
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
                </tr>
              ))}
            </tbody>
          </table>
          {page.items.length === 0 && <p class="muted">No workload matches.</p>}
          <div class="actions">
            <button type="button" disabled={pages.length === 0} onClick={() => setPages(pages.slice(0, -1))}>
              Previous page
            </button>
            <button type="button" disabled={!page.next} onClick={() => page.next && setPages([...pages, page.next])}>
              Next page
            </button>
          </div>
        </>
      )}
    </>
  );
}

const FINAL = ["Succeeded", "Failed", "Cancelled"];

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
    (w.metadata.owner?.subject === me.subject || can.platformAdmin || can.adminOf.length > 0);
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
      <h2>Spec</h2>
      <pre class="spec">{JSON.stringify(w.spec, null, 2)}</pre>
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
