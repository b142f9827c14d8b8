import { useState } from "preact/hooks";
import { ApiError, Cluster, Me, NodeView, abilities, all, api, updateSpec } from "../api";
import { usePoll } from "../app";
import { GpuCells, GpuHeads, fmt } from "./overview";

interface ClusterNodes {
  cluster: Cluster;
  nodes: NodeView[];
}

async function load(): Promise<ClusterNodes[]> {
  const clusters = await all<Cluster>("/api/v1/clusters");
  return Promise.all(
    clusters.map(async (cluster) => ({
      cluster,
      nodes: (await api<{ items: NodeView[] }>(`/api/v1/clusters/${cluster.metadata.name}/nodes`)).items,
    })),
  );
}

/// Nodes grouped by flavor and topology block, in name order of the first node.
export function nodeGroups(nodes: NodeView[]) {
  const groups = new Map<string, { flavor: string; block: string; nodes: NodeView[] }>();
  for (const n of nodes) {
    const flavor = n.flavor ?? "(no flavor)";
    const block = n.block ?? "—";
    const key = `${flavor}\u0000${block}`;
    const g = groups.get(key) ?? { flavor, block, nodes: [] };
    g.nodes.push(n);
    groups.set(key, g);
  }
  return [...groups.values()];
}

/// Clusters: health, inventory per flavor and per node group, and cordon / uncordon for
/// platform admins.
export function Clusters({ me }: { me: Me }) {
  const [data, error, reload] = usePoll(load);
  const [problem, setProblem] = useState<string | null>(null);
  const admin = abilities(me).platformAdmin;
  if (!data) return error ? <p class="error" role="alert">{error.message}</p> : <p class="loading">Loading…</p>;
  const cordon = async (c: Cluster, cordoned: boolean) => {
    setProblem(null);
    try {
      await updateSpec<Cluster["spec"]>(`/api/v1/clusters/${c.metadata.name}`, (spec) => ({ ...spec, cordoned }));
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
      {data.map(({ cluster: c, nodes }) => (
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
                <GpuHeads />
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
          <table class="node-groups">
            <caption>Node groups</caption>
            <thead>
              <tr>
                <th scope="col">Flavor</th>
                <th scope="col">Block</th>
                <th scope="col" class="num">Nodes (schedulable)</th>
                <th scope="col" class="num">GPUs</th>
                <th scope="col" class="num">Placed by Berth</th>
                <th scope="col" class="num">Unavailable</th>
              </tr>
            </thead>
            <tbody>
              {nodeGroups(nodes).map((g) => {
                const sum = (f: (n: NodeView) => number) => g.nodes.reduce((a, n) => a + f(n), 0);
                return (
                  <tr data-group={`${g.flavor}/${g.block}`}>
                    <td>{g.flavor}</td>
                    <td>{g.block}</td>
                    <td class="num">
                      {g.nodes.length} ({g.nodes.filter((n) => n.schedulable).length})
                    </td>
                    <td class="num">{sum((n) => n.gpus)}</td>
                    <td class="num">{fmt(sum((n) => n.allocated_gpus))}</td>
                    <td class="num">{sum((n) => n.unavailable_gpus)}</td>
                  </tr>
                );
              })}
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
