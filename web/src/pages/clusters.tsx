import { useState } from "preact/hooks";
import { ApiError, Cluster, Me, abilities, all, api } from "../api";
import { usePoll } from "../app";
import { GpuCells } from "./overview";

/// Clusters: health, inventory per flavor, and cordon / uncordon for platform admins.
export function Clusters({ me }: { me: Me }) {
  const [clusters, error, reload] = usePoll(() => all<Cluster>("/api/v1/clusters"));
  const [problem, setProblem] = useState<string | null>(null);
  const admin = abilities(me).platformAdmin;
  if (!clusters) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const cordon = async (c: Cluster, cordoned: boolean) => {
    setProblem(null);
    try {
      await api(`/api/v1/clusters/${c.metadata.name}`, {
        method: "PUT",
        body: {
          metadata: { labels: c.metadata.labels ?? {}, resource_version: c.metadata.resource_version },
          spec: { ...c.spec, cordoned },
        },
      });
    } catch (e) {
      setProblem(e instanceof ApiError ? e.message : String(e));
    }
    reload();
  };
  return (
    <>
      <h1>Clusters</h1>
      {error && <p class="error" role="alert">Not refreshed: {error.message}</p>}
      {problem && <p class="error" role="alert">{problem}</p>}
      {clusters.map((c) => (
        <section class="cluster" data-cluster={c.metadata.name} aria-labelledby={`cluster-${c.metadata.name}`}>
          <h2 id={`cluster-${c.metadata.name}`}>
            {c.metadata.name} <span class="muted">({c.spec.kind})</span>{" "}
            <span class={`badge ${c.status.health.toLowerCase()}`}>{c.status.health}</span>
            {c.spec.cordoned && <span class="badge cordoned">cordoned</span>}
          </h2>
          {c.status.message && <p class="muted">{c.status.message}</p>}
          <p class="muted">Last inventory: {c.status.last_sync ? new Date(c.status.last_sync).toLocaleString() : "never"}</p>
          <table>
            <thead>
              <tr>
                <th scope="col">Flavor</th>
                <th scope="col" class="num">Nodes</th>
                <th scope="col" class="num">GPUs</th>
                <th scope="col" class="num">Allocated</th>
                <th scope="col" class="num">Free</th>
              </tr>
            </thead>
            <tbody>
              {c.status.inventory.map((i) => (
                <tr data-flavor={i.flavor}>
                  <td>{i.flavor}</td>
                  <td class="num">{i.nodes}</td>
                  <GpuCells inv={i} />
                </tr>
              ))}
            </tbody>
          </table>
          {admin && (
            <div class="actions">
              <button type="button" onClick={() => cordon(c, !c.spec.cordoned)}>
                {c.spec.cordoned ? "Uncordon" : "Cordon"}
                <span class="visually-hidden"> {c.metadata.name}</span>
              </button>
            </div>
          )}
        </section>
      ))}
    </>
  );
}
