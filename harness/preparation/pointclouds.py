"""Point clouds for the host to turn into IDX files: ModelNet40 from the files people have, and
a procedural 40-class stand-in that needs no download.

Only the host runs this (harness/preparation/artifacts.py writes the IDX files every runner reads), so
h5py and trimesh are needed here and never on a board; both are imported only when real
files are read. Every cloud has STORED_POINTS points, zero centroid and unit radius (the
farthest point at distance 1), the normalisation PointNet trains on.

Every random number here comes from zobench-z (workloads/zrng.py), on streams of this
module's own, so a mesh is sampled and the synthetic set drawn alike on every host; the
training runs never draw from these streams.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads import zrng
from workloads.datasets import STORED_POINTS, DatasetError, POINT_SETS

REAL, SYNTHETIC = "modelnet40", "modelnet40-synthetic"
CLASSES = POINT_SETS[REAL]
SPLITS = ("train", "test")
# ModelNet40's sizes, which the synthetic set copies
SIZES = {"train": 9843, "test": 2468}
SEED = 0
# zobench-z streams of the host's data preparation (the runners use 1-3: zrng.py)
STREAM_SURFACE = 0x5001    # counter = a mesh's index in its split: where its points lie
STREAM_ORDER = 0x5002      # counter = split index: the order clouds are stored in
STREAM_SHAPES = 0x5003     # counter = split index * CLASSES + class: a synthetic class's draws
HDF5_DIRS = (".", "modelnet40_ply_hdf5_2048")   # where the HDF5 release may lie in the data set's folder
MESH_DIR = "ModelNet40"


def normalise(clouds: np.ndarray) -> np.ndarray:
    """float32 [N, P, 3] clouds moved to zero centroid and scaled to unit radius."""
    c = clouds - clouds.mean(axis=1, keepdims=True)
    radius = np.sqrt((c * c).sum(axis=2)).max(axis=1)
    return (c / np.maximum(radius, 1e-12)[:, None, None]).astype(np.float32)


def _order(split: str, n: int) -> np.ndarray:
    """A fixed shuffle, so that a job's first train_samples clouds hold every class."""
    return np.argsort(zrng.bits(zrng.stream_key(SEED, STREAM_ORDER, SPLITS.index(split)), 0, n), kind="stable")


# --- ModelNet40 as released ---------------------------------------------------------------

def sources(folder: Path) -> list[Path]:
    """The release files in a data set folder: the HDF5 release's, or else every mesh of the mesh
    release; [] if neither is there."""
    for sub in HDF5_DIRS:
        found = sorted((folder / sub).glob("ply_data_*.h5"))
        if found:
            return found
    return sorted((folder / MESH_DIR).glob("*/*/*.off"))


def read_release(files: list[Path], split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's normalised clouds and uint8 labels from the files sources() found."""
    read = _read_hdf5 if files[0].suffix == ".h5" else _read_meshes
    return read([f for f in files if _split_of(f) == split], split)


def _split_of(f: Path) -> str:
    if f.suffix == ".h5":
        return "train" if f.name.startswith("ply_data_train") else "test"
    return f.parent.name


def _bad(f: Path, why: str) -> DatasetError:
    return DatasetError(f"dataset {REAL!r}: {f}: {why}; replace it")


def _read_hdf5(files: list[Path], split: str) -> tuple[np.ndarray, np.ndarray]:
    """The HDF5 release: `data` [N, 2048, 3] and `label` [N, 1] per file; the first 1,024 points
    of each cloud, as PointNet takes them. The release is shuffled already."""
    import h5py

    if not files:
        raise DatasetError(f"dataset {REAL!r}: no ply_data_{split}*.h5 beside the other HDF5 files")
    clouds, labels = [], []
    for f in files:
        try:
            with h5py.File(f, "r") as h:
                data, label = h["data"], h["label"]
                if data.ndim != 3 or data.shape[1] < STORED_POINTS or data.shape[2] != 3:
                    raise _bad(f, f"its data is {data.shape}, expected [N, >= {STORED_POINTS}, 3]")
                if label.shape not in ((len(data), 1), (len(data),)):
                    raise _bad(f, f"its label is {label.shape}, expected [{len(data)}, 1]")
                clouds.append(np.asarray(data[:, :STORED_POINTS], np.float32))
                labels.append(np.asarray(label, np.int64).reshape(-1))
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise _bad(f, f"not a readable ModelNet40 HDF5 file ({e})") from None
        if labels[-1].size and not (0 <= labels[-1].min() and labels[-1].max() < CLASSES):
            raise _bad(f, f"labels outside 0..{CLASSES - 1}")
        if not np.isfinite(clouds[-1]).all():
            raise _bad(f, "its data holds NaN or infinite values")
    return normalise(np.concatenate(clouds)), np.concatenate(labels).astype(np.uint8)


def _read_meshes(files: list[Path], split: str) -> tuple[np.ndarray, np.ndarray]:
    """The mesh release: ModelNet40/<class>/<split>/*.off, class index = the sorted class folder
    names; STORED_POINTS points per mesh sampled by surface area, stored in a fixed shuffle."""
    import trimesh

    names = sorted({f.parents[1].name for f in files})
    if len(names) != CLASSES:
        raise DatasetError(f"dataset {REAL!r}: {files[0].parents[2] if files else MESH_DIR} has "
                           f"{split} meshes of {len(names)} classes, expected {CLASSES}")
    order = _order(split, len(files))
    clouds = np.empty((len(files), STORED_POINTS, 3), np.float32)
    labels = np.empty(len(files), np.uint8)
    for i, j in enumerate(order):
        f = files[j]
        try:
            mesh = trimesh.load(f, file_type="off", force="mesh", process=False)
            vertices, faces = np.asarray(mesh.vertices, np.float64), np.asarray(mesh.faces, np.int64)
        except Exception as e:   # trimesh raises whatever its parser met; each is a damaged file
            raise _bad(f, f"not a readable OFF mesh ({type(e).__name__}: {e})") from None
        clouds[i] = sample_surface(vertices, faces, zrng.stream_key(SEED, STREAM_SURFACE, int(j)), f)
        labels[i] = names.index(f.parents[1].name)
    return normalise(clouds), labels


def sample_surface(vertices: np.ndarray, faces: np.ndarray, key: int, f: Path) -> np.ndarray:
    """STORED_POINTS points uniform on a triangle mesh's surface (a triangle by its area, a point
    in it by two uniforms), drawn from zobench-z key."""
    if not len(faces) or not np.isfinite(vertices).all():
        raise _bad(f, "a mesh with no faces or with non-finite vertices")
    a, b, c = (vertices[faces[:, k]] for k in range(3))
    area = np.cumsum(np.linalg.norm(np.cross(b - a, c - a), axis=1))
    if not area[-1] > 0:
        raise _bad(f, "a mesh of zero area")
    u = zrng.uniform(key, 0, 3 * STORED_POINTS).astype(np.float64).reshape(3, -1)
    tri = np.minimum(np.searchsorted(area, u[0] * area[-1], side="right"), len(faces) - 1)
    s = np.sqrt(u[1])[:, None]   # (1 - s, s(1 - t), st) is uniform on a triangle
    t = u[2][:, None]
    return (1 - s) * a[tri] + s * (1 - t) * b[tri] + s * t * c[tri]


# --- the synthetic stand-in ---------------------------------------------------------------

@dataclass
class Part:
    """One primitive of a shape: its kind, size parameters (arrays over the samples), centre
    and the world axis its own z axis lies along."""
    kind: str
    size: tuple
    at: tuple = (0, 0, 0)
    axis: str = "z"
    caps: tuple = (1, 1)      # frustum: whether its bottom and top disks are there


def _frustum_t(r1, r2, u):
    """Height fraction t of a uniform point on a frustum's side: its density grows with the
    radius r1 + (r2 - r1) t (inverse CDF, stable for r1 = r2 and for r1 = 0)."""
    return u * (r1 + r2) / (r1 + np.sqrt(r1 * r1 + u * (r2 * r2 - r1 * r1)) + 1e-30)


def _ring(radius, angle):
    return radius * np.cos(angle), radius * np.sin(angle)


def _surface(part: Part, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points [n, P, 3] on one part's surface (from u [n, P, 4] in [0, 1)) and its area [n]:
    each kind sampled analytically, uniformly by area (a torus's tube angle by Newton on its
    CDF; an ellipsoid's is the sphere's, stretched)."""
    s = [np.broadcast_to(np.asarray(v, np.float64), u.shape[:1])[:, None] for v in part.size]
    u0, u1, u2, u3 = (u[..., k] for k in range(4))
    phi = 2 * np.pi * u2
    if part.kind == "box":         # half extents a, b, c: one of the six faces by area, then a point on it
        half = np.concatenate(s, axis=-1)[:, None, :]                                # [n, 1, 3]
        face = np.repeat(half[..., [1, 0, 0]] * half[..., [2, 2, 1]], 2, axis=-1)   # [n, 1, 6]: -x +x -y ...
        cum = np.cumsum(face, axis=-1)
        which = (u0[..., None] * cum[..., -1:] >= cum).sum(-1).clip(0, 5)
        p = np.stack([2 * u1 - 1, 2 * u2 - 1, 2 * u3 - 1], axis=-1)
        np.put_along_axis(p, (which // 2)[..., None], (2.0 * (which % 2) - 1)[..., None], axis=-1)
        return p * half, 4 * cum[:, 0, -1]
    if part.kind == "frustum":     # radii r1 (bottom), r2 (top), height h, centred
        r1, r2, h = s
        side = np.pi * (r1 + r2) * np.sqrt(h * h + (r1 - r2) ** 2)
        bottom, top = part.caps[0] * np.pi * r1 * r1, part.caps[1] * np.pi * r2 * r2
        total = side + bottom + top
        pick = u0 * total
        t = _frustum_t(r1, r2, u1)
        disk = np.sqrt(u1)
        on_bottom, on_top = (pick >= side) & (pick < side + bottom), pick >= side + bottom
        radius = np.where(on_bottom, r1 * disk, np.where(on_top, r2 * disk, r1 + (r2 - r1) * t))
        z = np.where(on_bottom, 0.0, np.where(on_top, 1.0, t)) * h - h / 2
        return np.stack([*_ring(radius, phi), z + 0 * radius], axis=-1), total[:, 0]
    if part.kind == "ellipsoid":   # semi-axes a, b, c
        z = 2 * u1 - 1
        x, y = _ring(np.sqrt(1 - z * z), phi)
        a, b, c = s
        p = 1.6075    # Knud Thomsen's area formula (within 1.1%)
        area = 4 * np.pi * (((a * b) ** p + (a * c) ** p + (b * c) ** p) / 3) ** (1 / p)
        return np.stack([a * x, b * y, c * z], axis=-1), area[:, 0]
    if part.kind == "capsule":     # radius r, straight length h
        r, h = s
        side, ball = 2 * np.pi * r * h, 4 * np.pi * r * r
        on_side = u0 * (side + ball) < side
        z = 2 * u1 - 1
        x, y = _ring(np.where(on_side, 1.0, np.sqrt(1 - z * z)) * r, phi)
        z = np.where(on_side, (u1 - 0.5) * h, r * z + np.sign(z) * h / 2)
        return np.stack([x, y, z], axis=-1), (side + ball)[:, 0]
    if part.kind == "torus":       # ring radius R, tube radius r
        R, r = s
        k = r / R                      # the tube angle's density is (1 + k cos(theta)) / 2 pi
        theta = 2 * np.pi * u1
        for _ in range(6):
            theta -= (theta + k * np.sin(theta) - 2 * np.pi * u1) / (1 + k * np.cos(theta))
        x, y = _ring(R + r * np.cos(theta), phi)
        return np.stack([x, y, r * np.sin(theta)], axis=-1), (4 * np.pi ** 2 * R * r)[:, 0]
    raise ValueError(f"unknown part kind {part.kind!r}")


_AXES = {"z": [0, 1, 2], "x": [2, 1, 0], "y": [0, 2, 1]}


def _shape(parts: list[Part], u: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """Points [n, P, 3] on the union of parts: each point on a part chosen by area. Every part
    shares the uniforms u, as each point takes exactly one part's."""
    points, areas = [], []
    for part in parts:
        p, a = _surface(part, u)
        n = len(p)
        at = np.stack([np.broadcast_to(np.asarray(c, np.float64), (n,)) for c in part.at], axis=-1)
        points.append(p[..., _AXES[part.axis]] + at[:, None, :])
        areas.append(a)
    cum = np.cumsum(np.stack(areas, axis=-1), axis=-1)           # [n, parts]
    which = (pick[..., None] * cum[:, None, -1:] >= cum[:, None, :]).sum(-1).clip(0, len(parts) - 1)
    return np.take_along_axis(np.stack(points, axis=2), which[..., None, None], axis=2)[:, :, 0]


def _families():
    """The 40 classes: each a function of r(lo, hi) (per-sample uniform draws) returning its
    parts. Sizes are drawn per sample, so a class is a family of shapes, not one shape."""
    def legs(w, d, h, radius, z=0.0):
        return [Part("frustum", (radius, radius, h), (sx * w, sy * d, z + h / 2)) for sx in (-1, 1) for sy in (-1, 1)]

    def ball(radius, at=(0, 0, 0)):
        return Part("ellipsoid", (radius, radius, radius), at)

    def rod(radius, h, at=(0, 0, 0), axis="z", caps=(1, 1)):
        return Part("frustum", (radius, radius, h), at, axis, caps)

    def table(r):
        w, d, h = r(0.8, 1.4), r(0.5, 0.9), r(0.6, 1.0)
        return [Part("box", (w, d, r(0.03, 0.06)), (0, 0, h)),
                *legs(w * r(0.8, 0.95), d * r(0.8, 0.95), h, r(0.03, 0.07))]

    def stool(r):
        radius, h = r(0.5, 0.8), r(0.8, 1.2)
        return [rod(radius, r(0.04, 0.08), (0, 0, h)), rod(r(0.05, 0.1), h, (0, 0, h / 2)),
                rod(radius * r(0.4, 0.7), 0.05)]

    def chair(r):
        w, h, back = r(0.4, 0.55), r(0.4, 0.55), r(0.4, 0.7)
        return [Part("box", (w, w, 0.04), (0, 0, h)), Part("box", (w, 0.04, back), (0, -w, h + back)),
                *legs(w * 0.9, w * 0.9, h, r(0.03, 0.05))]

    def lamp(r):
        h = r(1.2, 2.0)
        return [rod(r(0.3, 0.5), 0.05), rod(0.04, h, (0, 0, h / 2)),
                Part("frustum", (r(0.4, 0.6), r(0.15, 0.3), r(0.3, 0.5)), (0, 0, h), caps=(0, 0))]

    def bottle(r):
        radius, h, neck = r(0.3, 0.45), r(1.0, 1.6), r(0.3, 0.6)
        return [rod(radius, h, (0, 0, h / 2), caps=(1, 0)),
                Part("frustum", (radius, radius * 0.35, 0.3), (0, 0, h + 0.15), caps=(0, 0)),
                rod(radius * 0.35, neck, (0, 0, h + 0.3 + neck / 2), caps=(0, 1))]

    def mug(r):
        radius, h = r(0.4, 0.6), r(0.8, 1.2)
        return [rod(radius, h, caps=(1, 0)), Part("torus", (h * 0.3, r(0.04, 0.07)), (radius + h * 0.25, 0, 0), "y")]

    def vase(r):
        h1, h2, waist = r(0.6, 1.0), r(0.6, 1.0), r(0.8, 1.2)
        return [Part("frustum", (r(0.3, 0.5), waist, h1), (0, 0, h1 / 2), caps=(1, 0)),
                Part("frustum", (waist, r(0.25, 0.45), h2), (0, 0, h1 + h2 / 2), caps=(0, 0))]

    def snowman(r):
        a, b, c = r(0.9, 1.1), r(0.6, 0.75), r(0.35, 0.5)
        return [ball(a), ball(b, (0, 0, a + b * 0.8)), ball(c, (0, 0, a + 1.6 * b + c * 0.8))]

    def dumbbell(r):
        half, radius = r(0.8, 1.4), r(0.3, 0.5)
        return [ball(radius, (-half, 0, 0)), ball(radius, (half, 0, 0)), rod(r(0.08, 0.15), 2 * half, axis="x")]

    def pencil(r):
        radius, h, tip = r(0.15, 0.3), r(1.5, 2.5), r(0.3, 0.6)
        return [rod(radius, h, caps=(1, 0)), Part("frustum", (radius, 0, tip), (0, 0, (h + tip) / 2), caps=(0, 0))]

    def mushroom(r):
        h, cap = r(0.6, 1.0), r(0.7, 1.0)
        return [rod(r(0.15, 0.25), h, (0, 0, h / 2)), Part("ellipsoid", (cap, cap, cap * r(0.3, 0.5)), (0, 0, h))]

    def tiers(r):
        a, b, c = r(0.9, 1.1), r(0.6, 0.75), r(0.3, 0.45)
        t = r(0.15, 0.3)
        return [Part("box", (a, a, t), (0, 0, t)), Part("box", (b, b, t), (0, 0, 3 * t)),
                Part("box", (c, c, t), (0, 0, 5 * t))]

    def ell(r):
        a, b, t = r(0.8, 1.2), r(0.8, 1.2), r(0.1, 0.2)
        return [Part("box", (a, t, t), (a, 0, 0)), Part("box", (t, t, b), (0, 0, b))]

    def tee(r):
        a, b, t = r(0.8, 1.2), r(0.8, 1.2), r(0.1, 0.2)
        return [Part("box", (a, t, t), (0, 0, 2 * b)), Part("box", (t, t, b), (0, 0, b))]

    def plus(r):
        a, b, t = r(0.8, 1.2), r(0.8, 1.2), r(0.1, 0.2)
        return [Part("box", (a, t, t)), Part("box", (t, b, t))]

    def arch(r):
        w, h, t = r(0.6, 1.0), r(0.6, 1.0), r(0.1, 0.2)
        return [Part("box", (t, t, h), (-w, 0, h)), Part("box", (t, t, h), (w, 0, h)),
                Part("box", (w + t, t, t), (0, 0, 2 * h + t))]

    def four_balls(r):
        d, radius = r(0.7, 1.0), r(0.3, 0.5)
        return [ball(radius, (sx * d, sy * d, 0)) for sx in (-1, 1) for sy in (-1, 1)]

    def sign(r):
        h, radius = r(1.2, 2.0), r(0.4, 0.6)
        return [rod(0.04, h, (0, 0, h / 2)), rod(radius, 0.04, (0, 0, h + radius), axis="x")]

    def house(r):
        w, h, roof = r(0.8, 1.1), r(0.5, 0.8), r(0.5, 0.9)
        return [Part("box", (w, w, h), (0, 0, h)),
                Part("frustum", (w * 1.4, 0, roof), (0, 0, 2 * h + roof / 2), caps=(1, 0))]

    def airplane(r):
        length, span = r(1.4, 2.0), r(1.4, 2.0)
        return [Part("capsule", (r(0.12, 0.2), 2 * length), axis="x"), Part("box", (r(0.3, 0.45), span, 0.03)),
                Part("box", (0.15, span * 0.3, 0.03), (-length, 0, 0)),
                Part("box", (0.15, 0.03, 0.3), (-length, 0, 0.3))]

    def car(r):
        length, w, wheel = r(1.2, 1.6), r(0.6, 0.8), r(0.25, 0.35)
        return [Part("box", (length, w, 0.3), (0, 0, wheel + 0.3)),
                Part("box", (length * 0.5, w * 0.85, 0.25), (-0.2, 0, wheel + 0.85)),
                *[rod(wheel, 0.15, (sx * length * 0.7, sy * w, wheel), "y") for sx in (-1, 1) for sy in (-1, 1)]]

    def glasses(r):
        radius = r(0.4, 0.6)
        return [Part("torus", (radius, r(0.05, 0.09)), (0, sy * radius * 1.15, 0), "x") for sy in (-1, 1)]

    return [
        lambda r: [Part("box", (r(0.85, 1.15), r(0.85, 1.15), r(0.85, 1.15)))],        # cube
        lambda r: [Part("box", (r(1.0, 1.5), r(1.0, 1.5), r(0.08, 0.2)))],              # slab
        lambda r: [Part("box", (r(2.0, 3.0), r(0.2, 0.4), r(0.2, 0.4)))],               # bar
        lambda r: [Part("ellipsoid", (r(0.95, 1.05), r(0.95, 1.05), r(0.95, 1.05)))],   # sphere
        lambda r: [Part("ellipsoid", (1.0, r(0.85, 1.15), r(0.3, 0.5)))],               # oblate
        lambda r: [Part("ellipsoid", (r(1.8, 2.5), r(0.6, 0.8), r(0.6, 0.8)))],         # prolate
        lambda r: [rod(r(0.8, 1.2), r(1.5, 2.5))],                                      # cylinder
        lambda r: [rod(r(0.15, 0.3), r(4.0, 6.0))],                                     # pole
        lambda r: [rod(r(1.0, 1.3), r(0.1, 0.3))],                                      # disk
        lambda r: [Part("frustum", (r(0.8, 1.2), 0.0, r(1.5, 2.5)))],         # cone
        lambda r: [Part("frustum", (r(1.0, 1.2), r(0.4, 0.6), r(1.0, 1.5)))],           # frustum
        lambda r: [Part("frustum", (0.0, r(0.8, 1.2), r(1.5, 2.5)))],         # cone upside down
        lambda r: [Part("capsule", (r(0.4, 0.6), r(1.5, 2.5)))],                        # capsule
        lambda r: [Part("capsule", (r(0.4, 0.6), r(1.5, 2.5)), axis="x")],              # lying capsule
        lambda r: [Part("torus", (1.0, r(0.1, 0.2)))],                                  # ring
        lambda r: [Part("torus", (1.0, r(0.35, 0.5)))],                                 # donut
        table, stool, chair,
        lambda r: [Part("box", (r(0.8, 1.1), r(1.6, 2.2), r(0.2, 0.3)), (0, 0, 0.3)),
                   Part("box", (r(0.8, 1.1), 0.05, r(0.4, 0.6)), (0, -2.0, 0.5))],    # bed
        lamp, bottle, mug,
        lambda r: [Part("frustum", (r(0.4, 0.6), 1.0, r(0.4, 0.7)), caps=(1, 0))],     # bowl
        vase, snowman, dumbbell, pencil, mushroom, tiers, ell, tee, plus, arch, four_balls, sign, house,
        airplane, car, glasses,
    ]


FAMILIES = _families()
assert len(FAMILIES) == CLASSES


class _Draws:
    """Draws from one zobench-z key, taken in order: uniform in [0, 1), or normal."""

    def __init__(self, key: int):
        self.key, self.at = key, 0

    def take(self, *shape: int, draw=zrng.uniform) -> np.ndarray:
        count = int(np.prod(shape))
        x = draw(self.key, self.at, count).astype(np.float64).reshape(shape)
        self.at += count
        return x


def synthetic(split: str, n: int = 0, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """n (0 = ModelNet40's count) normalised clouds of one split and their uint8 labels, the
    classes in turn and then shuffled; a pure function of (split, n, seed). Each class's
    samples are drawn together, vectorised: ~1 s a thousand clouds."""
    n = n or SIZES[split]
    labels = (np.arange(n) % CLASSES)[_order(split, n)].astype(np.uint8)
    clouds = np.empty((n, STORED_POINTS, 3), np.float32)
    for c, family in enumerate(FAMILIES):
        idx = np.flatnonzero(labels == c)
        if len(idx):
            clouds[idx] = _draw_class(family, len(idx), zrng.stream_key(seed, STREAM_SHAPES,
                                                                        SPLITS.index(split) * CLASSES + c))
    return clouds, labels


def _draw_class(family, n: int, key: int) -> np.ndarray:
    """n clouds of one family: sizes, surface points, a turn about the up axis (z) and a small
    tilt, then per-point jitter (sigma 0.01 of the radius, clipped at 0.05)."""
    d = _Draws(key)
    parts = family(lambda lo, hi: lo + (hi - lo) * d.take(n))
    points = _shape(parts, d.take(n, STORED_POINTS, 4), d.take(n, STORED_POINTS))
    turn, tilt = 2 * np.pi * d.take(n), 0.05 * d.take(n, 2, draw=zrng.normal)
    cz, sz, cx, sx, cy, sy = (f(a) for a in (turn, tilt[:, 0], tilt[:, 1]) for f in (np.cos, np.sin))
    one, zero = np.ones(n), np.zeros(n)
    rz = np.stack([cz, -sz, zero, sz, cz, zero, zero, zero, one], -1).reshape(n, 3, 3)
    rx = np.stack([one, zero, zero, zero, cx, -sx, zero, sx, cx], -1).reshape(n, 3, 3)
    ry = np.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).reshape(n, 3, 3)
    points = normalise(np.einsum("nij,npj->npi", rz @ rx @ ry, points))
    jitter = np.clip(0.01 * d.take(n, STORED_POINTS, 3, draw=zrng.normal), -0.05, 0.05)
    return normalise(points + jitter)


def source_text() -> bytes:
    """The code the clouds are made by (this module and zobench-z): part of their cache key."""
    return Path(zrng.__file__).read_bytes() + Path(__file__).read_bytes()
