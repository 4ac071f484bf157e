"""A per-CPU scheduling heatmap: CPUs (rows) x time bins (columns) coloured by the
fraction of the bin the CPU spent running a task other than idle. SVG written by
hand; PNG through a small zlib writer with a 3x5 bitmap font for the labels."""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from .fmt import Event
from .intervals import Selection, runs

MAX_BINS = 4000
MAX_CELLS = 1_000_000  # CPUs x bins: bounds the grid, the SVG's rects and the PNG's pixels
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


def busy_grid(
    events: Iterable[Event],
    bin_ms: float | None = None,
    ncpus: int | None = None,
    filt: dict | None = None,
) -> Grid:
    """`filt`: the trace's filter; with one, the cells show the selected tasks' runs
    (intervals.Selection), as `trace stats` counts them."""
    events = list(events)
    if not events:
        raise ValueError("the trace holds no events")
    start = min(e.ts_ns for e in events)
    end = max(e.ts_ns for e in events)
    cpus = list(range(ncpus)) if ncpus else sorted({e.cpu for e in events})
    max_bins = min(MAX_BINS, MAX_CELLS // len(cpus))
    bin_ms = bin_ms or auto_bin_ms(end - start, min(200, max_bins))
    bin_ns = max(1, int(bin_ms * 1e6))
    nbins = max(1, math.ceil((end - start) / bin_ns))
    if nbins > max_bins:
        raise ValueError(
            f"{nbins} time bins of {bin_ms} ms: too many (at most {max_bins} for "
            f"{len(cpus)} CPUs); use a larger --bin-ms "
            f"(at least {math.ceil((end - start) / 1e6 / max_bins)})"
        )
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
    for (f0, c0), (f1, c1) in pairwise(stops):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            return tuple(round(a + (b - a) * t) for a, b in zip(c0, c1, strict=True))
    return stops[-1][1]


def hex_colour(f: float) -> str:
    """`colour(f)` as SVG writes it: rrggbb."""
    r, g, b = colour(f)
    return f"{r:02x}{g:02x}{b:02x}"


@dataclass(frozen=True)
class Layout:
    """Geometry shared by both renderers; tests check files against it. From the top: the
    title, the rows of cells (labelled CPU n on the left), the time axis with its ticks and
    name, the legend."""

    cell_w: int
    cell_h: int
    left: int = 70
    top: int = 40
    bottom: int = 76
    right: int = 40  # half the widest tick label: the last one is centred on the edge

    def size(self, grid: Grid) -> tuple[int, int]:
        # at least as wide as the axis name and legend under the cells
        return (
            max(MIN_WIDTH, self.left + grid.bins * self.cell_w + self.right),
            self.top + len(grid.cpus) * self.cell_h + self.bottom,
        )

    def label_every(self) -> int:
        """Label every n-th row: labels need 12 px."""
        return math.ceil(12 / self.cell_h)


MIN_PLOT_H = 200  # px of cells at least: with title, axis and legend, about 300 px in all
MAX_PLOT_H = 4000


def layout_for(grid: Grid) -> Layout:
    rows = max(1, len(grid.cpus))
    cell_h = (
        max(24, math.ceil(MIN_PLOT_H / rows))
        if rows * 24 <= MAX_PLOT_H
        else max(3, MAX_PLOT_H // rows)
    )
    return Layout(cell_w=max(1, min(20, 1000 // max(1, grid.bins))), cell_h=cell_h)


def _ticks(grid: Grid, n: int = 5) -> list[tuple[int, str]]:
    """(bin index, seconds label) for about n x-axis ticks."""
    step = max(1, grid.bins // n)
    return [(i, f"{i * grid.bin_ns / 1e9:.3g}s") for i in range(0, grid.bins + 1, step)]


def title(grid: Grid) -> str:
    return f"CPU busy fraction, {grid.bin_ns / 1e6:g} ms bins"


def axis_name(grid: Grid) -> str:
    return f"time (s), bins of {grid.bin_ns / 1e6:g} ms"


def svg(grid: Grid) -> str:
    lay = layout_for(grid)
    w, h = lay.size(grid)
    cw, ch, x0, y0 = lay.cell_w, lay.cell_h, lay.left, lay.top
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        f"<title>{title(grid)}</title>",
        (
            f'<text class="title" x="{x0}" y="24" font-size="14" font-weight="bold">'
            f"{title(grid)}</text>"
        ),
    ]
    for r, cpu in enumerate(grid.cpus):
        y = y0 + r * ch
        if r % lay.label_every() == 0:
            out.append(
                f'<text x="{x0 - 6}" y="{y + ch / 2 + 4}" text-anchor="end">CPU {cpu}</text>'
            )
        out.append(f'<g class="row" data-cpu="{cpu}">')
        for i, f in enumerate(grid.busy[r]):
            out.append(
                f'<rect class="cell" x="{x0 + i * cw}" y="{y}" width="{cw}" height="{ch}" '
                f'fill="#{hex_colour(f)}"><title>{f * 100:.0f}%</title></rect>'
            )
        out.append("</g>")
    yb = y0 + len(grid.cpus) * ch
    out.append(f'<line x1="{x0}" y1="{yb}" x2="{x0 + grid.bins * cw}" y2="{yb}" stroke="black"/>')
    for i, label in _ticks(grid):
        x = x0 + i * cw
        out.append(f'<line x1="{x}" y1="{yb}" x2="{x}" y2="{yb + 4}" stroke="black"/>')
        out.append(f'<text x="{x}" y="{yb + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text class="axis" x="{x0}" y="{yb + 34}">{axis_name(grid)}</text>')
    # legend: a gradient from 0 to 100 % busy
    lx, ly = x0 + 30, yb + 48
    out.append(
        '<defs><linearGradient id="busy">'
        + "".join(
            f'<stop offset="{k * 10}%" stop-color="#{hex_colour(k / 10)}"/>' for k in range(11)
        )
        + "</linearGradient></defs>"
    )
    out.append(
        f'<rect class="legend" x="{lx}" y="{ly}" width="100" height="10" '
        'fill="url(#busy)" stroke="black"/>'
    )
    out.append(f'<text x="{lx - 4}" y="{ly + 9}" text-anchor="end">0%</text>')
    out.append(f'<text x="{lx + 104}" y="{ly + 9}">100% busy</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# A 3x5 pixel font, upper case (the PNG's text is drawn in capitals): five rows, top to
# bottom, each an octal digit whose three bits are the pixels left to right.
FONT = {
    "A": "25755",
    "B": "65656",
    "C": "34443",
    "D": "65556",
    "E": "74647",
    "F": "74644",
    "G": "34553",
    "H": "55755",
    "I": "72227",
    "J": "11152",
    "K": "55655",
    "L": "44447",
    "M": "57755",
    "N": "65555",
    "O": "25552",
    "P": "65644",
    "Q": "25563",
    "R": "65655",
    "S": "34216",
    "T": "72222",
    "U": "55557",
    "V": "55552",
    "W": "55775",
    "X": "55255",
    "Y": "55222",
    "Z": "71247",
    "0": "75557",
    "1": "26227",
    "2": "71747",
    "3": "71717",
    "4": "55711",
    "5": "74717",
    "6": "74757",
    "7": "71111",
    "8": "75757",
    "9": "75717",
    " ": "00000",
    ".": "00002",
    ",": "00024",
    "%": "51245",
    "(": "12221",
    ")": "42224",
    "-": "00700",
    "+": "02720",
    ":": "02020",
    "/": "11244",
}
GLYPH_W, GLYPH_H = 3, 5


class Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def rect(self, x: int, y: int, w: int, h: int, rgb: tuple[int, int, int]) -> None:
        x0, x1 = max(0, x), min(self.w, x + w)
        if x1 <= x0:
            return
        row = bytes(rgb) * (x1 - x0)
        for yy in range(max(0, y), min(self.h, y + h)):
            o = (yy * self.w + x0) * 3
            self.px[o : o + len(row)] = row

    @staticmethod
    def text_width(s: str, scale: int = 2) -> int:
        return max(0, len(s) * (GLYPH_W + 1) * scale - scale)

    def text(self, x: int, y: int, s: str, scale: int = 2, anchor: str = "start") -> None:
        """`s` in capitals with its top at y; anchor "start", "middle" or "end" at x."""
        x -= {
            "start": 0,
            "middle": self.text_width(s, scale) // 2,
            "end": self.text_width(s, scale),
        }[anchor]
        for ch in s.upper():
            for r, bits in enumerate(FONT.get(ch, "00000")):
                for c in range(GLYPH_W):
                    if int(bits, 8) & (4 >> c):
                        self.rect(x + c * scale, y + r * scale, scale, scale, (0, 0, 0))
            x += (GLYPH_W + 1) * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.px[y * self.w * 3 : (y + 1) * self.w * 3]) for y in range(self.h)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + kind
                + data
                + struct.pack(">I", zlib.crc32(kind + data))
            )

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b"")
        )


def png(grid: Grid) -> bytes:
    """The SVG's picture: title, labelled rows, time axis with ticks and name, legend."""
    lay = layout_for(grid)
    w, h = lay.size(grid)
    cv = Canvas(w, h)
    cw, ch, x0, y0 = lay.cell_w, lay.cell_h, lay.left, lay.top
    cv.text(x0, 10, title(grid), scale=3)
    for r, cpu in enumerate(grid.cpus):
        y = y0 + r * ch
        if r % lay.label_every() == 0:
            cv.text(x0 - 6, y + ch // 2 - GLYPH_H, f"CPU {cpu}", anchor="end")
        for i, f in enumerate(grid.busy[r]):
            cv.rect(x0 + i * cw, y, cw, ch, colour(f))
    yb = y0 + len(grid.cpus) * ch
    cv.rect(x0, yb, grid.bins * cw, 1, (0, 0, 0))
    cv.rect(x0 - 1, y0, 1, yb - y0, (0, 0, 0))
    for i, label in _ticks(grid):
        cv.rect(x0 + i * cw, yb, 1, 4, (0, 0, 0))
        cv.text(x0 + i * cw, yb + 8, label, anchor="middle")
    cv.text(x0, yb + 26, axis_name(grid))
    lx, ly = x0 + 30, yb + 48
    cv.text(lx - 6, ly, "0%", anchor="end")
    for k in range(100):
        cv.rect(lx + k, ly, 1, 10, colour(k / 99))
    cv.text(lx + 108, ly, "100% busy")
    return cv.png()
