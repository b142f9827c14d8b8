import { Queue as QueueHead, api, gpusOf } from "../api";
import { usePoll } from "../app";
import { fmt } from "./overview";

const SHOWN = 100;

/// Pending workloads in the order the scheduler will consider them, with its reason (the
/// first hundred; the API orders them).
export function Queue() {
  const [queue, error] = usePoll(() => api<QueueHead>(`/api/v1/queue?limit=${SHOWN}`));
  if (!queue) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const ordered = queue.items;
  return (
    <>
      <h1>Queue</h1>
      {error && <p class="error" role="alert">Not refreshed: {error.message}</p>}
      <p class="muted">
        {queue.total} workload{queue.total === 1 ? "" : "s"} waiting for {fmt(queue.gpus)} GPU{fmt(queue.gpus) === "1" ? "" : "s"}
        {queue.total > ordered.length ? `; the first ${ordered.length} shown` : ""}.
      </p>
      <table class="queue">
        <thead>
          <tr>
            <th scope="col" class="num">Position</th>
            <th scope="col">Workload</th>
            <th scope="col">Owner</th>
            <th scope="col" class="num">GPUs</th>
            <th scope="col">Flavors</th>
            <th scope="col">Why it waits</th>
            <th scope="col">Expected start</th>
          </tr>
        </thead>
        <tbody>
          {ordered.map((w) => (
            <tr data-workload={`${w.metadata.team}/${w.metadata.name}`}>
              <td class="num">{w.status.queue_position ? w.status.queue_position.global : "—"}</td>
              <td>
                <a href={`#/workload/${w.metadata.team}/${w.metadata.name}`}>
                  {w.metadata.team}/{w.metadata.name}
                </a>
              </td>
              <td>{w.metadata.owner?.subject ?? ""}</td>
              <td class="num">{fmt(gpusOf(w))}</td>
              <td>{w.spec.tasks.resources.flavors.join(", ")}</td>
              <td class="reason">
                {w.status.pending_reason?.code === "BudgetExhausted" && (
                  <a class="badge budget" href="#/reports" title="Its team's budget is used up: see Reports">
                    budget
                  </a>
                )}
                {w.status.pending_reason?.message ?? <span class="muted">not yet considered</span>}
              </td>
              <td title={w.status.estimated_start?.basis}>
                {w.status.estimated_start ? new Date(w.status.estimated_start.at).toLocaleString() : <span class="muted">unknown</span>}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}
