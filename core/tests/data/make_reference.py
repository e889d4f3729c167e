"""Tile footprints and zone-grid placements by geotessera 0.11.0, for core/tests/geotessera_reference.rs.

Run with Python 3.12 and geotessera 0.11.0 from PyPI (which brings pyproj
3.8.0 and its bundled PROJ 9.8.1):

    python3.12 -m venv /tmp/gt && /tmp/gt/bin/pip install geotessera==0.11.0
    /tmp/gt/bin/python core/tests/data/make_reference.py \
        | gzip -9n > core/tests/data/geotessera-0.11.0-edges.jsonl.gz

Every number comes from geotessera's own functions: `project_tile` for a
tile's footprint, `_compute_zone_grid_from_landmask` for a zone grid over
a set of tiles and `_tile_pixel_offset` for each tile's place in it. Tiles
are given to them as geotessera gets them from its registry, centre
hundredths / 100.0. Deterministic (seeded), so the output is reproducible
byte for byte with the same geotessera, pyproj and PROJ.
"""

import json
import math
import random
import sys

import pyproj
from geotessera import zarr as gz

SEED = 20240611
RANDOM_TILES = 20000
# geotessera's grid covers every latitude its registry accepts, -90..90.
IY = range(-900, 900)


def centre(i):
    """Centre in degrees of cell i, as geotessera computes it: hundredths / 100."""
    return (10 * i + 5) / 100.0


def name(ix, iy):
    def f(h):
        s = "-" if h < 0 else ""
        return f"{s}{abs(h) // 100}.{abs(h) % 100:02d}"

    return f"grid_{f(10 * ix + 5)}_{f(10 * iy + 5)}"


def footprint(ix, iy, cache):
    ti = gz.project_tile(centre(ix), centre(iy), transformer_cache=cache)
    return ti.epsg, ti.transform.c, ti.transform.f, ti.width, ti.height


def edge_columns():
    """Cell columns whose west or east edge is a central meridian or a zone boundary.

    Meridians every 3 degrees from -180 (boundaries at -180 + 6k, central
    meridians at -177 + 6k) are cell edges at ix = 30 m; the cell west of one
    is ix - 1 (ix = -1800's west neighbour is ix = 1799, east edge 180).
    """
    cols = set()
    for m in range(-1800, 1800, 30):
        cols.add(m)
        cols.add((m - 1 + 1800) % 3600 - 1800)
    return sorted(cols)


def mm(v):
    """Metres to whole millimetres, rounded half to even."""
    return round(v * 1000)


def first_differences(xs):
    """[x0, x1 - x0, x2 - x1, ...]: whole pixels change by 0 or 1 down a column."""
    return xs[:1] + [b - a for a, b in zip(xs, xs[1:])]


def second_differences(xs):
    """The first differences' first differences: coordinates change smoothly down a column, so these are small."""
    return first_differences(first_differences(xs))


def column_records(cols, cache, full):
    """One record per column and hemisphere; the lists run over iy ascending.

    Footprint coordinates are kept to the millimetre (second differences of
    whole millimetres) and, exactly, the pixel each one falls in,
    floor(coordinate / 10 m): on a central meridian the easting is 500 km
    give or take 1e-9 m, and only the pixel keeps which side it fell.
    """
    for ix in cols:
        for rows in (range(-900, 0), range(0, 900)):
            rec = {"type": "column", "ix": ix, "iy0": rows[0]}
            fps = [footprint(ix, iy, cache) for iy in rows]
            epsgs = {fp[0] for fp in fps}
            assert len(epsgs) == 1, (ix, epsgs)
            rec["zone"] = gz.tile_zone(centre(ix))
            rec["epsg"] = epsgs.pop()
            if full:
                rec["origin_e"] = [fp[1] for fp in fps]
                rec["origin_n"] = [fp[2] for fp in fps]
            else:
                rec["origin_e_mm_dd"] = second_differences([mm(fp[1]) for fp in fps])
                rec["origin_n_mm_dd"] = second_differences([mm(fp[2]) for fp in fps])
                rec["e_px_d"] = first_differences([math.floor(fp[1] / 10) for fp in fps])
                rec["n_px_d"] = first_differences([math.floor(fp[2] / 10) for fp in fps])
            rec["width"] = [fp[3] for fp in fps]
            rec["height"] = [fp[4] for fp in fps]
            yield rec


def tile_record(ix, iy, cache):
    epsg, e, n, w, h = footprint(ix, iy, cache)
    return {
        "type": "tile",
        "tile": name(ix, iy),
        "zone": gz.tile_zone(centre(ix)),
        "epsg": epsg,
        "origin_e": e,
        "origin_n": n,
        "width": w,
        "height": h,
    }


def zone_grid_record(cells, cache):
    coords = [(centre(ix), centre(iy)) for ix, iy in cells]
    zones = {gz.tile_zone(lon) for lon, _ in coords}
    assert len(zones) == 1, cells
    zone = zones.pop()
    grid = gz._compute_zone_grid_from_landmask(zone, coords, [2024])
    placed = []
    for (ix, iy), (lon, lat) in zip(cells, coords):
        ti = gz.project_tile(lon, lat, transformer_cache=cache)
        row, col = gz._tile_pixel_offset(ti, grid)
        placed.append(
            {"tile": name(ix, iy), "row": row, "col": col, "width": ti.width, "height": ti.height}
        )
    return {
        "type": "zone_grid",
        "zone": zone,
        "tiles": [name(ix, iy) for ix, iy in cells],
        "origin_x": grid.origin_x,
        "origin_y": grid.origin_y,
        "width_px": grid.width_px,
        "height_px": grid.height_px,
        "placed": placed,
    }


def block(ix0, iy0, ncols, nrows):
    return [(ix, iy) for ix in range(ix0, ix0 + ncols) for iy in range(iy0, iy0 + nrows)]


def clusters(rng):
    """Blocks of tiles in one zone whose columns include an edge column.

    For every zone: a block across its central meridian, one whose west
    column starts on it (so the grid origin is that column), one that ends on
    it, one starting on the zone's west boundary and one ending on its east
    boundary; each at a few random latitudes, at the equator and near both
    poles. Plus the 25 tiles of issue 10.
    """
    out = [block(926, -738, 5, 5)]  # grid_92.65..93.05_-73.75..-73.35
    for z in range(1, 61):
        west = -1800 + 60 * (z - 1)  # ix of the zone's first column
        cm = west + 30
        starts = [
            (cm - 2, 4),  # straddles the central meridian
            (cm, 3),  # starts on it
            (cm - 3, 3),  # ends on it
            (west, 3),  # starts on the west boundary
            (west + 57, 3),  # ends on the east boundary
        ]
        lats = [-900, -2, 897] + [rng.randrange(-900, 897) for _ in range(3)]
        for ix0, ncols in starts:
            for iy0 in lats:
                out.append(block(ix0, iy0, ncols, 3))
    return out


def main():
    rng = random.Random(SEED)
    cache = {}
    out = sys.stdout
    meta = {
        "type": "meta",
        "made_by": "core/tests/data/make_reference.py",
        "geotessera": "0.11.0",
        "pyproj": pyproj.__version__,
        "proj": pyproj.proj_version_str,
        "python": sys.version.split()[0],
        "seed": SEED,
    }
    print(json.dumps(meta), file=out)
    cols = edge_columns()
    full = "--full" in sys.argv[1:]
    for rec in column_records(cols, cache, full):
        print(json.dumps(rec, separators=(",", ":")), file=out)
    colset = set(cols)
    n = 0
    while n < RANDOM_TILES:
        ix, iy = rng.randrange(-1800, 1800), rng.randrange(-900, 900)
        if ix in colset:
            continue
        print(json.dumps(tile_record(ix, iy, cache), separators=(",", ":")), file=out)
        n += 1
    for cells in clusters(rng):
        print(json.dumps(zone_grid_record(cells, cache), separators=(",", ":")), file=out)


if __name__ == "__main__":
    main()
