/**
 * Pure: a small line chart as a standalone SVG string, written by hand so
 * the bench needs no charting dependency. Axes may be linear or log10;
 * horizontal reference lines mark a fixed level (the ceiling, a target).
 */

export interface Point {
  readonly x: number;
  readonly y: number;
}

export interface Series {
  readonly name: string;
  readonly points: readonly Point[];
}

export interface ReferenceLine {
  readonly name: string;
  readonly y: number;
}

export interface ChartSpec {
  readonly title: string;
  readonly xLabel: string;
  readonly yLabel: string;
  readonly series: readonly Series[];
  readonly references?: readonly ReferenceLine[];
  readonly xScale?: 'linear' | 'log';
  readonly yScale?: 'linear' | 'log';
  readonly width?: number;
  readonly height?: number;
}

const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];
const REFERENCE_COLOURS = ['#555555', '#aa7700', '#007777'];

export function escapeXml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
}

/** Compact tick text: 1500 -> 1.5k, 20000 -> 20k, 0.25 -> 0.25. */
export function tickText(value: number): string {
  const abs = Math.abs(value);
  const trim = (n: number) => String(Number(n.toPrecision(3)));
  if (abs >= 1e6) return `${trim(value / 1e6)}M`;
  if (abs >= 1e3) return `${trim(value / 1e3)}k`;
  return trim(value);
}

/** Round tick values covering [min, max]: 1-2-5 steps for linear, powers of ten (and 2, 5) for log. */
export function ticks(min: number, max: number, scale: 'linear' | 'log'): number[] {
  if (scale === 'log') {
    const out: number[] = [];
    for (let e = Math.floor(Math.log10(min)); e <= Math.ceil(Math.log10(max)); e++) {
      for (const m of [1, 2, 5]) {
        const v = m * 10 ** e;
        if (v >= min * 0.999 && v <= max * 1.001) out.push(v);
      }
    }
    return out;
  }
  const span = max - min || Math.abs(max) || 1;
  const raw = span / 5;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw)!;
  const out: number[] = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** The padded data range on one axis; log ranges snap to the decades around the data. */
function range(values: readonly number[], scale: 'linear' | 'log', zeroBased: boolean): [number, number] {
  const usable = values.filter((v) => Number.isFinite(v) && (scale === 'linear' || v > 0));
  if (usable.length === 0) return scale === 'log' ? [1, 10] : [0, 1];
  let lo = Math.min(...usable);
  let hi = Math.max(...usable);
  if (scale === 'log') return [10 ** Math.floor(Math.log10(lo)), 10 ** Math.ceil(Math.log10(hi) + 1e-9)];
  if (zeroBased) lo = Math.min(0, lo);
  if (hi === lo) hi = lo + 1;
  const pad = (hi - lo) * 0.08;
  return [zeroBased && lo === 0 ? 0 : lo - pad, hi + pad];
}

export function renderLineChart(spec: ChartSpec): string {
  const width = spec.width ?? 860;
  const height = spec.height ?? 420;
  const xScale = spec.xScale ?? 'linear';
  const yScale = spec.yScale ?? 'linear';
  const margin = { left: 78, right: 330, top: 44, bottom: 56 };
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
  const points = spec.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y));
  const refs = (spec.references ?? []).filter((r) => Number.isFinite(r.y));
  const [x0, x1] = range(
    points.map((p) => p.x),
    xScale,
    false,
  );
  const [y0, y1] = range([...points.map((p) => p.y), ...refs.map((r) => r.y)], yScale, true);
  const t = (v: number, scale: 'linear' | 'log') => (scale === 'log' ? Math.log10(v) : v);
  const px = (x: number) => margin.left + ((t(x, xScale) - t(x0, xScale)) / (t(x1, xScale) - t(x0, xScale) || 1)) * plotW;
  const py = (y: number) => margin.top + plotH - ((t(y, yScale) - t(y0, yScale)) / (t(y1, yScale) - t(y0, yScale) || 1)) * plotH;
  const f = (n: number) => n.toFixed(1);
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
  );
  out.push(`<title>${escapeXml(spec.title)}</title>`);
  out.push(`<rect x="0" y="0" width="${width}" height="${height}" fill="#ffffff"/>`);
  out.push(`<text x="${width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">${escapeXml(spec.title)}</text>`);
  // Grid and ticks.
  for (const v of ticks(y0, y1, yScale)) {
    out.push(`<line x1="${margin.left}" y1="${f(py(v))}" x2="${margin.left + plotW}" y2="${f(py(v))}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${margin.left - 6}" y="${f(py(v) + 4)}" text-anchor="end">${escapeXml(tickText(v))}</text>`);
  }
  for (const v of ticks(x0, x1, xScale)) {
    out.push(`<line x1="${f(px(v))}" y1="${margin.top}" x2="${f(px(v))}" y2="${margin.top + plotH}" stroke="#f0f0f0"/>`);
    out.push(`<text x="${f(px(v))}" y="${margin.top + plotH + 18}" text-anchor="middle">${escapeXml(tickText(v))}</text>`);
  }
  out.push(`<rect x="${margin.left}" y="${margin.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#333333"/>`);
  out.push(`<text x="${margin.left + plotW / 2}" y="${height - 14}" text-anchor="middle">${escapeXml(spec.xLabel)}</text>`);
  out.push(
    `<text x="18" y="${margin.top + plotH / 2}" text-anchor="middle" transform="rotate(-90 18 ${margin.top + plotH / 2})">${escapeXml(spec.yLabel)}</text>`,
  );
  // Legend entries, one line each, beside the plot.
  let legendY = margin.top + 10;
  const legend = (colour: string, name: string, dashed: boolean) => {
    const lx = margin.left + plotW + 14;
    out.push(
      `<line x1="${lx}" y1="${legendY}" x2="${lx + 22}" y2="${legendY}" stroke="${colour}" stroke-width="2"${dashed ? ' stroke-dasharray="6 4"' : ''}/>`,
    );
    out.push(`<text x="${lx + 28}" y="${legendY + 4}">${escapeXml(name)}</text>`);
    legendY += 18;
  };
  refs.forEach((r, i) => {
    const colour = REFERENCE_COLOURS[i % REFERENCE_COLOURS.length]!;
    out.push(
      `<line class="reference" x1="${margin.left}" y1="${f(py(r.y))}" x2="${margin.left + plotW}" y2="${f(py(r.y))}" stroke="${colour}" stroke-width="1.5" stroke-dasharray="6 4"/>`,
    );
    legend(colour, `${r.name} (${tickText(r.y)})`, true);
  });
  spec.series.forEach((s, i) => {
    const colour = PALETTE[i % PALETTE.length]!;
    const usable = s.points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y) && (xScale === 'linear' || p.x > 0) && (yScale === 'linear' || p.y > 0));
    const sorted = [...usable].sort((a, b) => a.x - b.x);
    if (sorted.length > 1) {
      out.push(
        `<polyline class="series" fill="none" stroke="${colour}" stroke-width="2" points="${sorted.map((p) => `${f(px(p.x))},${f(py(p.y))}`).join(' ')}"/>`,
      );
    }
    for (const p of sorted) {
      out.push(
        `<circle class="point" cx="${f(px(p.x))}" cy="${f(py(p.y))}" r="3.5" fill="${colour}"><title>${escapeXml(`${s.name}: ${tickText(p.x)}, ${tickText(p.y)}`)}</title></circle>`,
      );
    }
    legend(colour, s.name, false);
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
