"""A per-CPU scheduling heatmap: CPUs (rows) x time bins (columns) coloured by the
fraction of the bin the CPU spent running a task other than idle. SVG written by
hand; PNG through a small zlib writer with a 3x5 bitmap font for the labels."""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import Iterable

from .fmt import Event
from .intervals import Selection, runs

MAX_BINS = 4000
MIN_WIDTH = 400


@dataclass(frozen=True)
class Grid:
    start_ns: int
    bin_ns: int
    cpus: list[int]
    busy: list[list[float]]  # [row per cpu][bin] fraction 0..1

    @property
    def bins(self) -> int:
        return len(self.busy[0]) if self.busy else 0


def auto_bin_ms(span_ns: int, target_bins: int = 200) -> float:
    return max(1.0, math.ceil(span_ns / 1e6 / target_bins))


def busy_grid(events: Iterable[Event], bin_ms: float | None = None, ncpus: int | None = None,
              filt: dict | None = None) -> Grid:
    """`filt`: the trace's filter; with one, the cells show the selected tasks' runs
    (intervals.Selection), as `trace stats` counts them."""
    events = list(events)
    if not events:
        raise ValueError("the trace holds no events")
    start = min(e.ts_ns for e in events)
    end = max(e.ts_ns for e in events)
    bin_ms = bin_ms or auto_bin_ms(end - start)
    bin_ns = max(1, int(bin_ms * 1e6))
    nbins = max(1, math.ceil((end - start) / bin_ns))
    if nbins > MAX_BINS:
        raise ValueError(f"{nbins} time bins of {bin_ms} ms: too many (at most {MAX_BINS}); "
                         f"use a larger --bin-ms (at least {math.ceil((end - start) / 1e6 / MAX_BINS)})")
    cpus = list(range(ncpus)) if ncpus else sorted({e.cpu for e in events})
    row = {cpu: i for i, cpu in enumerate(cpus)}
    busy = [[0.0] * nbins for _ in cpus]
    for iv in runs(events, Selection(events, filt)):
        if iv.pid == 0 or iv.cpu not in row:
            continue
        r = busy[row[iv.cpu]]
        a, b = iv.start_ns - start, iv.end_ns - start
        for i in range(a // bin_ns, min(nbins - 1, (b - 1) // bin_ns) + 1):
            lo, hi = max(a, i * bin_ns), min(b, (i + 1) * bin_ns)
            if hi > lo:
                r[i] += (hi - lo) / bin_ns
    busy = [[min(1.0, v) for v in r] for r in busy]
    return Grid(start, bin_ns, cpus, busy)


def colour(f: float) -> tuple[int, int, int]:
    """White (idle) through orange to dark red (busy)."""
    stops = ((0.0, (255, 255, 255)), (0.5, (253, 141, 60)), (1.0, (128, 0, 38)))
    for (f0, c0), (f1, c1) in zip(stops, stops[1:]):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            return tuple(round(a + (b - a) * t) for a, b in zip(c0, c1))
    return stops[-1][1]


@dataclass(frozen=True)
class Layout:
    """Geometry shared by both renderers; tests check files against it."""
    cell_w: int
    cell_h: int
    left: int = 60
    top: int = 20
    bottom: int = 60
    right: int = 20

    def size(self, grid: Grid) -> tuple[int, int]:
        # at least as wide as the axis label and legend under the cells
        return (max(MIN_WIDTH, self.left + grid.bins * self.cell_w + self.right),
                self.top + len(grid.cpus) * self.cell_h + self.bottom)


def layout_for(grid: Grid) -> Layout:
    return Layout(cell_w=max(1, min(20, 1000 // max(1, grid.bins))), cell_h=24)


def _ticks(grid: Grid, n: int = 5) -> list[tuple[int, str]]:
    """(bin index, seconds label) for about n x-axis ticks."""
    step = max(1, grid.bins // n)
    return [(i, f"{i * grid.bin_ns / 1e9:.3g}s") for i in range(0, grid.bins + 1, step)]


def svg(grid: Grid) -> str:
    lay = layout_for(grid)
    w, h = lay.size(grid)
    cw, ch, x0, y0 = lay.cell_w, lay.cell_h, lay.left, lay.top
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
           f'<title>CPU busy fraction, {grid.bin_ns / 1e6:g} ms bins</title>']
    for r, cpu in enumerate(grid.cpus):
        y = y0 + r * ch
        out.append(f'<text x="{x0 - 6}" y="{y + ch / 2 + 4}" text-anchor="end">CPU {cpu}</text>')
        out.append(f'<g class="row" data-cpu="{cpu}">')
        for i, f in enumerate(grid.busy[r]):
            out.append(f'<rect class="cell" x="{x0 + i * cw}" y="{y}" width="{cw}" height="{ch}" '
                       f'fill="#{"%02x%02x%02x" % colour(f)}"><title>{f * 100:.0f}%</title></rect>')
        out.append("</g>")
    yb = y0 + len(grid.cpus) * ch
    out.append(f'<line x1="{x0}" y1="{yb}" x2="{x0 + grid.bins * cw}" y2="{yb}" stroke="black"/>')
    for i, label in _ticks(grid):
        x = x0 + i * cw
        out.append(f'<line x1="{x}" y1="{yb}" x2="{x}" y2="{yb + 4}" stroke="black"/>')
        out.append(f'<text x="{x}" y="{yb + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{x0}" y="{yb + 32}">time (bin {grid.bin_ns / 1e6:g} ms)</text>')
    # legend: a gradient from 0 to 100 % busy
    lx, ly = x0 + 150, yb + 36
    out.append('<defs><linearGradient id="busy">' + "".join(
        f'<stop offset="{k * 10}%" stop-color="#{"%02x%02x%02x" % colour(k / 10)}"/>' for k in range(11))
        + "</linearGradient></defs>")
    out.append(f'<rect class="legend" x="{lx}" y="{ly}" width="100" height="10" fill="url(#busy)" stroke="black"/>')
    out.append(f'<text x="{lx - 4}" y="{ly + 9}" text-anchor="end">0%</text>')
    out.append(f'<text x="{lx + 104}" y="{ly + 9}">100% busy</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# 3x5 glyphs, rows top to bottom, 3 bits each (MSB = left)
FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "s": (0, 3, 6, 1, 6),
    "%": (5, 1, 2, 4, 5), "C": (7, 4, 4, 4, 7), "P": (7, 5, 7, 4, 4), "U": (5, 5, 5, 5, 7),
    " ": (0, 0, 0, 0, 0), "e": (0, 7, 7, 4, 7), "-": (0, 0, 7, 0, 0), "m": (0, 7, 7, 5, 5),
}


class Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def rect(self, x: int, y: int, w: int, h: int, rgb: tuple[int, int, int]) -> None:
        row = bytes(rgb) * max(0, min(w, self.w - x))
        for yy in range(max(0, y), min(self.h, y + h)):
            o = (yy * self.w + x) * 3
            self.px[o:o + len(row)] = row

    def text(self, x: int, y: int, s: str, scale: int = 2) -> None:
        for ch in s:
            for r, bits in enumerate(FONT.get(ch, FONT[" "])):
                for c in range(3):
                    if bits & (4 >> c):
                        self.rect(x + c * scale, y + r * scale, scale, scale, (0, 0, 0))
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6))
                + chunk(b"IEND", b""))


def png(grid: Grid) -> bytes:
    lay = layout_for(grid)
    w, h = lay.size(grid)
    cv = Canvas(w, h)
    cw, ch, x0, y0 = lay.cell_w, lay.cell_h, lay.left, lay.top
    for r, cpu in enumerate(grid.cpus):
        y = y0 + r * ch
        cv.text(4, y + ch // 2 - 5, f"CPU{cpu}")
        for i, f in enumerate(grid.busy[r]):
            cv.rect(x0 + i * cw, y, cw, ch, colour(f))
    yb = y0 + len(grid.cpus) * ch
    cv.rect(x0, yb, grid.bins * cw, 1, (0, 0, 0))
    cv.rect(x0 - 1, y0, 1, yb - y0, (0, 0, 0))
    for i, label in _ticks(grid):
        cv.rect(x0 + i * cw, yb, 1, 4, (0, 0, 0))
        cv.text(x0 + i * cw - 4, yb + 8, label)
    lx, ly = x0 + 150, yb + 36
    cv.text(lx - 28, ly, "0%")
    for k in range(100):
        cv.rect(lx + k, ly, 1, 10, colour(k / 99))
    cv.text(lx + 106, ly, "100%")
    return cv.png()
