import re
import struct
import zlib

import pytest
from trace_samples import PID_FILTER, filtered_events, sample_events

from xhagent.trace.heatmap import busy_grid, layout_for, png, svg


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
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = size
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    return w, h, [raw[y * (1 + 3 * w) + 1:(y + 1) * (1 + 3 * w)] for y in range(h)]


def test_png_shape_and_rows():
    g = busy_grid(sample_events(), bin_ms=1, ncpus=2)
    lay = layout_for(g)
    w, h, rows = read_png(png(g))
    assert (w, h) == lay.size(g)

    def pixel(x, y):
        return tuple(rows[y][3 * x:3 * x + 3])

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
