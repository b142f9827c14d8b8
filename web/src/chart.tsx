import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { UsageHistory } from "./api";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];

/// Each team's GPUs (all flavors together) over time, as steps: the history holds a point
/// whenever a team's allocation changed.
export function toSeries(history: UsageHistory, now: number): { teams: string[]; data: number[][] } {
  const byTeam = new Map<string, { at: number; flavor: string; allocated: number }[]>();
  for (const s of history.series)
    for (const p of s.points) {
      const list = byTeam.get(s.team) ?? [];
      list.push({ at: Date.parse(p.at) / 1000, flavor: s.flavor, allocated: p.allocated });
      byTeam.set(s.team, list);
    }
  // From the start of the period to now, whatever the points.
  const since = Date.parse(history.since) / 1000;
  const times = [...new Set([...byTeam.values()].flatMap((l) => l.map((p) => p.at)).concat([since, now]))].sort(
    (a, b) => a - b,
  );
  const teams = [...byTeam.keys()].sort();
  const data = [times];
  for (const team of teams) {
    const points = byTeam.get(team)!.sort((a, b) => a.at - b.at);
    const current = new Map<string, number>();
    let i = 0;
    data.push(
      times.map((t) => {
        while (i < points.length && points[i].at <= t) {
          current.set(points[i].flavor, points[i].allocated);
          i++;
        }
        return [...current.values()].reduce((a, b) => a + b, 0);
      }),
    );
  }
  return { teams, data };
}

export function UsageChart({ history }: { history: UsageHistory }) {
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const { teams, data } = toSeries(history, Date.now() / 1000);
    if (teams.length === 0) return;
    const width = Math.max(280, el.clientWidth);
    const plot = new uPlot(
      {
        width,
        height: 240,
        series: [
          {},
          ...teams.map((team, i) => ({
            label: team,
            stroke: COLORS[i % COLORS.length],
            width: 2,
            paths: uPlot.paths.stepped!({ align: 1 }),
          })),
        ],
        axes: [{}, { label: "GPUs" }],
        scales: { x: { time: true } },
      },
      data as uPlot.AlignedData,
      el,
    );
    return () => plot.destroy();
  }, [history]);
  const empty = history.series.length === 0;
  return (
    <div class="chart" ref={box} role="img" aria-label="GPUs allocated per team over time">
      {empty && <p class="muted">No team has held GPUs in this period.</p>}
    </div>
  );
}
