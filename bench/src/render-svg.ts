/**
 * Pure: a small line chart as a standalone SVG string, written by hand so
 * the bench needs no charting dependency. Axes may be linear or log10;
 * horizontal reference lines mark a fixed level (the ceiling, a target).
 */

export interface Point {
  readonly x: number;
  readonly y: number;
  /** Written beside the point, for a point that stands for something of its own. */
  readonly label?: string;
}

export interface Series {
  readonly name: string;
  readonly points: readonly Point[];
  /** false: points only, not joined (a figure taken another way than the line's). Default true. */
  readonly line?: boolean;
  /** The point marker; a diamond sets a point apart from the circles of the swept series. */
  readonly shape?: 'circle' | 'diamond';
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
  /** Lines of caption under the chart: how a figure was taken, what a marked point stands for. */
  readonly caption?: readonly string[];
  /** The whole chart's width; grown when the plot and the legend would not fit in it. */
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

/**
 * Width in pixels a line of 12 px sans-serif text takes, on the wide side:
 * the renderer has no font metrics, so it errs towards room to spare (digits
 * and lower case run at 6 to 7 px; capitals and 'm', 'w' wider).
 */
export function textWidth(text: string, fontSize = 12): number {
  let units = 0;
  for (const ch of text) units += /[A-Z@%&mwMW—]/.test(ch) ? 0.85 : /[ .,:;'’()|ijlft1]/.test(ch) ? 0.36 : 0.64;
  return Math.ceil(units * fontSize);
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

const LEGEND_GAP = 14;
const LEGEND_KEY = 28;
const MIN_PLOT_WIDTH = 452;
const CAPTION_LINE = 16;

export function renderLineChart(spec: ChartSpec): string {
  const xScale = spec.xScale ?? 'linear';
  const yScale = spec.yScale ?? 'linear';
  const points = spec.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y));
  const refs = (spec.references ?? []).filter((r) => Number.isFinite(r.y));
  const caption = spec.caption ?? [];
  // The legend sits beside the plot, as wide as its longest entry: the chart
  // grows to hold it rather than cutting it at the right edge.
  const legendNames = [...refs.map((r) => `${r.name} (${tickText(r.y)})`), ...spec.series.map((s) => s.name)];
  const legendW = LEGEND_GAP + LEGEND_KEY + Math.max(0, ...legendNames.map((n) => textWidth(n))) + 12;
  const margin = { left: 78, right: Math.max(40, legendW), top: 44, bottom: 56 + caption.length * CAPTION_LINE };
  const width = Math.max(
    spec.width ?? 860,
    margin.left + MIN_PLOT_WIDTH + margin.right,
    textWidth(spec.title, 15) + 40,
    ...caption.map((c) => textWidth(c) + 40),
  );
  const height = (spec.height ?? 420) + caption.length * CAPTION_LINE;
  const plotW = width - margin.left - margin.right;
  const plotH = height - margin.top - margin.bottom;
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
  out.push(`<text x="${margin.left + plotW / 2}" y="${margin.top + plotH + 42}" text-anchor="middle">${escapeXml(spec.xLabel)}</text>`);
  caption.forEach((line, i) => {
    out.push(`<text class="caption" x="${margin.left}" y="${margin.top + plotH + 64 + i * CAPTION_LINE}" fill="#444444">${escapeXml(line)}</text>`);
  });
  out.push(
    `<text x="18" y="${margin.top + plotH / 2}" text-anchor="middle" transform="rotate(-90 18 ${margin.top + plotH / 2})">${escapeXml(spec.yLabel)}</text>`,
  );
  // Legend entries, one line each, beside the plot.
  let legendY = margin.top + 10;
  const marker = (shape: 'circle' | 'diamond', cx: number, cy: number, colour: string, title?: string) => {
    const tip = title === undefined ? '' : `<title>${escapeXml(title)}</title>`;
    if (shape === 'diamond') {
      const r = 6;
      return `<path class="point" d="M${f(cx)} ${f(cy - r)} L${f(cx + r)} ${f(cy)} L${f(cx)} ${f(cy + r)} L${f(cx - r)} ${f(cy)} Z" fill="${colour}">${tip}</path>`;
    }
    return `<circle class="point" cx="${f(cx)}" cy="${f(cy)}" r="3.5" fill="${colour}">${tip}</circle>`;
  };
  const legend = (colour: string, name: string, kind: 'dashed' | 'line' | 'diamond') => {
    const lx = margin.left + plotW + LEGEND_GAP;
    if (kind === 'diamond') out.push(marker('diamond', lx + 11, legendY, colour));
    else
      out.push(
        `<line x1="${lx}" y1="${legendY}" x2="${lx + 22}" y2="${legendY}" stroke="${colour}" stroke-width="2"${kind === 'dashed' ? ' stroke-dasharray="6 4"' : ''}/>`,
      );
    out.push(`<text x="${lx + 28}" y="${legendY + 4}">${escapeXml(name)}</text>`);
    legendY += 18;
  };
  refs.forEach((r, i) => {
    const colour = REFERENCE_COLOURS[i % REFERENCE_COLOURS.length]!;
    out.push(
      `<line class="reference" x1="${margin.left}" y1="${f(py(r.y))}" x2="${margin.left + plotW}" y2="${f(py(r.y))}" stroke="${colour}" stroke-width="1.5" stroke-dasharray="6 4"/>`,
    );
    legend(colour, `${r.name} (${tickText(r.y)})`, 'dashed');
  });
  spec.series.forEach((s, i) => {
    const colour = PALETTE[i % PALETTE.length]!;
    const usable = s.points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y) && (xScale === 'linear' || p.x > 0) && (yScale === 'linear' || p.y > 0));
    const sorted = [...usable].sort((a, b) => a.x - b.x);
    const shape = s.shape ?? 'circle';
    if (sorted.length > 1 && s.line !== false) {
      out.push(
        `<polyline class="series" fill="none" stroke="${colour}" stroke-width="2" points="${sorted.map((p) => `${f(px(p.x))},${f(py(p.y))}`).join(' ')}"/>`,
      );
    }
    for (const p of sorted) {
      out.push(marker(shape, px(p.x), py(p.y), colour, `${s.name}: ${tickText(p.x)}, ${tickText(p.y)}`));
      if (p.label !== undefined) {
        // Left of the point when it sits in the right half, so the label stays inside the plot.
        const right = px(p.x) > margin.left + plotW / 2;
        out.push(
          `<text class="point-label" x="${f(px(p.x) + (right ? -10 : 10))}" y="${f(py(p.y) - 8)}" text-anchor="${right ? 'end' : 'start'}" fill="${colour}">${escapeXml(p.label)}</text>`,
        );
      }
    }
    legend(colour, s.name, s.line === false && shape === 'diamond' ? 'diamond' : 'line');
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
