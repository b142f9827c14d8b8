import { Workload, all, gpusOf } from "../api";
import { usePoll } from "../app";
import { fmt } from "./overview";

/// Pending workloads in the order the scheduler will consider them, with its reason.
export function Queue() {
  const [pending, error] = usePoll(() => all<Workload>("/api/v1/workloads?phase=Pending"));
  if (!pending) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const position = (w: Workload) => w.status.queue_position?.global ?? Number.MAX_SAFE_INTEGER;
  const ordered = [...pending].sort((a, b) => position(a) - position(b));
  return (
    <>
      <h1>Queue</h1>
      {error && <p class="error" role="alert">Not refreshed: {error.message}</p>}
      <p class="muted">
        {ordered.length} workload{ordered.length === 1 ? "" : "s"} waiting, {fmt(ordered.reduce((n, w) => n + gpusOf(w), 0))} GPUs.
      </p>
      <table class="queue">
        <thead>
          <tr>
            <th scope="col" class="num">Position</th>
            <th scope="col">Workload</th>
            <th scope="col" class="num">GPUs</th>
            <th scope="col">Flavors</th>
            <th scope="col">Why it waits</th>
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
              <td class="num">{fmt(gpusOf(w))}</td>
              <td>{w.spec.tasks.resources.flavors.join(", ")}</td>
              <td class="reason">{w.status.pending_reason?.message ?? <span class="muted">not yet considered</span>}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}
