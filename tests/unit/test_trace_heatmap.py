import re
import struct
import zlib

import pytest
from trace_samples import PID_FILTER, filtered_events, sample_events

from xhagent.trace.heatmap import (
    FONT,
    MAX_CELLS,
    Canvas,
    _ticks,
    axis_name,
    busy_grid,
    colour,
    layout_for,
    png,
    svg,
    title,
)


def test_busy_grid():
    g = busy_grid(sample_events(), bin_ms=1)
    assert g.cpus == [0, 1] and g.bins == 9
    # CPU 0: ping runs 1-3 ms and 6.004-9 ms (grid starts at 1 ms)
    assert g.busy[0][:2] == [1.0, 1.0] and g.busy[0][2] == 0.0
    assert g.busy[0][5] == pytest.approx(0.996)
    # CPU 1: busy from 1.0005 ms (the first event, no known start) ... pong 4-6, busy 6-10
    assert g.busy[1][3] == 1.0


def test_too_many_bins():
    with pytest.raises(ValueError, match="--bin-ms"):
        busy_grid(sample_events(), bin_ms=0.0001)


def test_svg_shape():
    g = busy_grid(sample_events(), bin_ms=1, ncpus=2)
    doc = svg(g)
    rows = re.findall(r'<g class="row" data-cpu="(\d+)">(.*?)</g>', doc, re.S)
    assert [r[0] for r in rows] == ["0", "1"]
    assert all(r[1].count('class="cell"') == g.bins for r in rows)
    w, h = layout_for(g).size(g)
    assert f'width="{w}" height="{h}"' in doc
    assert "CPU 0" in doc and "100% busy" in doc


def read_png(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = size
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    return w, h, [raw[y * (1 + 3 * w) + 1 : (y + 1) * (1 + 3 * w)] for y in range(h)]


def test_png_shape_and_rows():
    g = busy_grid(sample_events(), bin_ms=1, ncpus=2)
    lay = layout_for(g)
    w, h, rows = read_png(png(g))
    assert (w, h) == lay.size(g)

    def pixel(x, y):
        return tuple(rows[y][3 * x : 3 * x + 3])

    # one band per CPU: CPU 0 bin 0 is fully busy (dark), bin 2 idle (white)
    mid0 = lay.top + lay.cell_h // 2
    assert pixel(lay.left + lay.cell_w // 2, mid0) == (128, 0, 38)
    assert pixel(lay.left + 2 * lay.cell_w + lay.cell_w // 2, mid0) == (255, 255, 255)
    mid1 = lay.top + lay.cell_h + lay.cell_h // 2
    assert pixel(lay.left + 3 * lay.cell_w + lay.cell_w // 2, mid1) == (128, 0, 38)


def test_a_filtered_grid_shows_the_selected_tasks_runs():
    g = busy_grid(filtered_events(), bin_ms=50, ncpus=2, filt=PID_FILTER)
    # bins from 1 ms; CPU 0: ping 1-3 ms and 200-250 ms; migration/0's unrecorded
    # 3-200 ms is not drawn
    assert g.busy[0] == pytest.approx([0.04, 0.0, 0.0, 0.02, 0.98, 0.0])


def test_png_carries_the_svgs_title_axis_name_and_legend_unclipped():
    g = busy_grid(sample_events(), bin_ms=1, ncpus=2)
    lay = layout_for(g)
    w, h, rows = read_png(png(g))
    assert h >= 300  # was 128: two thin bands

    def inked(x0, y0, x1, y1):
        return sum(
            rows[y][3 * x : 3 * x + 3] == b"\0\0\0" for y in range(y0, y1) for x in range(x0, x1)
        )

    yb = lay.top + len(g.cpus) * lay.cell_h
    strings = [title(g), axis_name(g), "100% busy", "0%"] + [t for _, t in _ticks(g)]
    # every character the PNG writes has a glyph (an unknown one would be a blank)
    assert all(ch in FONT for s in strings for ch in s.upper())
    assert inked(lay.left, 10, lay.left + Canvas.text_width(title(g), 3), 25) > 100  # title
    assert inked(lay.left, yb + 26, lay.left + Canvas.text_width(axis_name(g)), yb + 36) > 100
    assert inked(0, lay.top, lay.left - 4, lay.top + lay.cell_h) > 20  # "CPU 0"
    # legend: the gradient from white to dark red, and its labels
    ly = yb + 48 + 5
    assert rows[ly][3 * (lay.left + 30) : 3 * (lay.left + 31)] == bytes(colour(0))
    assert rows[ly][3 * (lay.left + 129) : 3 * (lay.left + 130)] == bytes(colour(1))
    assert inked(lay.left + 130, yb + 48, w, yb + 58) > 50
    # tick labels, centred on their ticks, lie inside the image (the last one was cut)
    for i, label in _ticks(g):
        x = lay.left + i * lay.cell_w
        half = Canvas.text_width(label) // 2
        assert 0 <= x - half and x + half < w, label


def test_the_svg_has_a_visible_title_and_axis_name():
    g = busy_grid(sample_events(), bin_ms=1, ncpus=2)
    doc = svg(g)
    assert (
        f'<text class="title" x="70" y="24" font-size="14" font-weight="bold">{title(g)}</text>'
        in doc
    )
    assert f">{axis_name(g)}</text>" in doc and title(g) == "CPU busy fraction, 1 ms bins"


def test_many_cpus_keep_the_grid_and_image_bounded():
    g = busy_grid(sample_events(), ncpus=8192)  # automatic bins: fewer, to stay in bounds
    assert g.bins * len(g.cpus) <= MAX_CELLS
    lay = layout_for(g)
    assert lay.cell_h == 3 and lay.label_every() == 4
    with pytest.raises(
        ValueError, match="too many .at most 122 for 8192 CPUs.; use a larger --bin-ms"
    ):
        busy_grid(sample_events(), bin_ms=0.01, ncpus=8192)
