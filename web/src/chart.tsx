import { useEffect, useRef, useState } from "preact/hooks";

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];

/// One layer of a [`StackedChart`]: a value per bucket.
export interface Layer {
  label: string;
  values: number[];
}

/// A round step for about `count` ticks up to `max`.
function tickStep(max: number, count: number): number {
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
}

/// Layers stacked over time buckets, as an SVG area chart: `bounds` holds the buckets'
/// edges (n + 1 instants, ms), each layer a value per bucket, drawn at the bucket's middle;
/// a legend names each layer with its sum (or `legendValue` of its values). `format` writes
/// a value, `when` a bucket's start. Layers `pickable` says yes to are buttons in the legend
/// that call `onPick` (to drill down).
export function StackedChart({
  bounds,
  layers,
  label,
  unit,
  format,
  when,
  legendValue = (values) => values.reduce((a, b) => a + b, 0),
  pickable = () => false,
  onPick,
}: {
  bounds: number[];
  layers: Layer[];
  label: string;
  unit: string;
  format: (v: number) => string;
  when: (t: number) => string;
  legendValue?: (values: number[]) => number;
  pickable?: (label: string) => boolean;
  onPick?: (label: string) => void;
}) {
  const box = useRef<HTMLDivElement>(null);
  const [width, setWidth] = useState(640);
  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const measure = () => setWidth(Math.max(280, el.clientWidth - 16));
    measure();
    const watch = new ResizeObserver(measure);
    watch.observe(el);
    return () => watch.disconnect();
  }, []);
  const n = bounds.length - 1;
  const height = 240;
  const [left, right, top, bottom] = [52, 12, 10, 24];
  const sums = Array.from({ length: n }, (_, i) => layers.reduce((a, l) => a + l.values[i], 0));
  const max = Math.max(0, ...sums);
  const step = max > 0 ? tickStep(max, 4) : 1;
  const yMax = Math.max(step, Math.ceil(max / step) * step);
  const [t0, t1] = [bounds[0], bounds[n]];
  const x = (t: number) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - right);
  const y = (v: number) => top + (1 - v / yMax) * (height - top - bottom);
  // Each bucket at its middle; the first and last values reach the chart's edges.
  const xs = [t0, ...bounds.slice(0, n).map((b, i) => (b + bounds[i + 1]) / 2), t1].map(x);
  const at = (values: number[]) => [values[0], ...values, values[n - 1]];
  let below = at(new Array(n).fill(0));
  const areas = layers.map((l, k) => {
    const base = below;
    const over = at(l.values).map((v, i) => v + base[i]);
    below = over;
    const line = (vs: number[]) => vs.map((v, i) => `${xs[i].toFixed(1)},${y(v).toFixed(1)}`);
    const d = `M${line(over).join("L")}L${line(base).reverse().join("L")}Z`;
    return <path d={d} fill={COLORS[k % COLORS.length]} fill-opacity={0.85} stroke="#fff" stroke-width={0.75} data-layer={l.label} />;
  });
  const ticks = Array.from({ length: Math.round(yMax / step) + 1 }, (_, i) => i * step);
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  // Every k-th bucket's start labelled, k as small as the widest label allows; each centred
  // on its bucket's start but kept inside the chart, and left out where it would overlap.
  const texts = bounds.slice(0, n).map(when);
  const widest = Math.max(0, ...texts.map((t) => t.length * 6.6)) + 12;
  const every = Math.max(1, Math.ceil(widest / ((width - left - right) / Math.max(1, n))));
  let free = 0;
  const labels = texts.flatMap((text, i) => {
    const half = text.length * 3.3;
    const at = Math.min(Math.max(x(bounds[i]), left + half), width - right - half);
    if (i % every !== 0 || at - half < free) return [];
    free = at + half + 12;
    return [{ at, text }];
  });
  return (
    <div class="chart" ref={box}>
      {n === 0 || layers.length === 0 ? (
        <p class="muted">Nothing used in this period.</p>
      ) : (
        <>
          <svg width={width} height={height} role="img" aria-label={label}>
            <title>{label}</title>
            {ticks.map((v) => (
              <g class="tick">
                <line x1={left} x2={width - right} y1={y(v)} y2={y(v)} />
                <text x={left - 6} y={y(v) + 4} text-anchor="end">
                  {v.toLocaleString("en-US", { maximumFractionDigits: decimals })}
                </text>
              </g>
            ))}
            <text class="axis-label" x={12} y={top + (height - top - bottom) / 2} transform={`rotate(-90 12 ${top + (height - top - bottom) / 2})`} text-anchor="middle">
              {unit}
            </text>
            {areas}
            {labels.map((l) => (
              <text class="tick" x={l.at} y={height - 6} text-anchor="middle">
                {l.text}
              </text>
            ))}
            {bounds.slice(0, n).map((b, i) => (
              <>
                <rect class="hover" x={x(b)} y={top} width={Math.max(0, x(bounds[i + 1]) - x(b))} height={height - top - bottom}>
                  <title>
                    {`${when(b)}: ${format(sums[i])} ${unit}`}
                    {layers.filter((l) => l.values[i] > 0).map((l) => `\n${l.label}: ${format(l.values[i])}`).join("")}
                  </title>
                </rect>
              </>
            ))}
          </svg>
          <ul class="legend">
            {layers.map((l, k) => (
              <li data-layer={l.label}>
                <span class="swatch" style={{ background: COLORS[k % COLORS.length] }} />
                {onPick && pickable(l.label) ? (
                  <button type="button" class="link" onClick={() => onPick(l.label)}>
                    {l.label}
                  </button>
                ) : (
                  l.label
                )}{" "}
                <span class="muted">{format(legendValue(l.values))}</span>
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}
