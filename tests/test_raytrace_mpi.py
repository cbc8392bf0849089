"""The ray tracer: the distributed image equals the one-process reference on any rank count."""

import argparse
import gc
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import rafi
from conftest import SIMULATOR
from rafi.examples import raytrace, render_loop
from rafi.examples.render_loop import to_png
from rafi.examples.scene import decompose, local_cells, make_scene
from rafi.kernels import raytrace as rt
from rafi.kernels.raytrace import reference_render

SMALL = (
    dict(width=8, height=6, samples=1, bounces=1, grid=4)
    if SIMULATOR
    else dict(width=40, height=30, samples=2, bounces=2, grid=8)
)


def options(backend, scene="spheres", mode="bsp"):
    return argparse.Namespace(seed=3, scene=scene, backend=backend, quiet=True, mode=mode, **SMALL)


class _Cycle:
    """An object that only the cyclic garbage collector frees: it refers to itself."""

    def __init__(self):
        self.me = self


def leaves_heap_unfrozen(run):
    """Return ``(run(), whether the run left the heap unfrozen)``: a cycle made before the
    run, dropped after it, is freed by a collection only if it is not frozen. (Python 3.12's
    ``gc.get_freeze_count()`` is not 0 on an unfrozen heap, so it cannot tell.)"""
    cycle = _Cycle()
    freed = weakref.ref(cycle)
    out = run()
    del cycle
    gc.collect()
    return out, freed() is None


def reference(opts):
    cells = make_scene(opts.scene, opts.grid, opts.seed)
    total = reference_render(opts.width, opts.height, opts.samples, opts.bounces, opts.seed, cells, opts.grid)
    return total / opts.samples


@pytest.mark.parametrize("launch", ["one-rank", pytest.param("mpirun", marks=pytest.mark.mpi(min_size=2))])
@pytest.mark.parametrize("scene", ["spheres", "dense"])
@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_image_matches_reference_on_any_rank_count(comm, backend, scene, launch, mode):
    """Run serially (1 rank) and under mpirun -n 2 and -n 3, in rounds or asynchronously:
    every rank count and every mode give the reference image."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    opts = options(backend, scene, mode)
    image, info = raytrace.render(opts, comm)
    if comm.Get_rank() == 0:
        ref = reference(opts)
        assert image.shape == ref.shape and ref.max() > 0.1
        np.testing.assert_allclose(image, ref, rtol=1e-9, atol=1e-12)  # summation order only
        assert info["rays"] > opts.width * opts.height


@pytest.mark.parametrize("launch", ["one-rank", pytest.param("mpirun", marks=pytest.mark.mpi(min_size=2))])
def test_samples_traced_together_give_the_image_in_fewer_rounds(comm, backend, launch):
    """A pass of several samples (the default, as many as fit in memory) gives the image of
    one sample per pass, in fewer rounds."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    opts = options(backend)
    opts.samples = 2
    runs = {}
    for per_pass in (1, 0):
        opts.samples_per_pass = per_pass
        runs[per_pass], unfrozen = leaves_heap_unfrozen(lambda: raytrace.render(opts, comm))
        assert unfrozen  # a render leaves nothing frozen for the next one
    (single, one), (image, together) = runs[1], runs[0]
    assert (one["samples_per_pass"], together["samples_per_pass"]) == (1, 2)
    assert together["rays"] == one["rays"] and together["rounds"] < one["rounds"]
    if comm.Get_rank() == 0:
        np.testing.assert_allclose(image, single, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(image, reference(opts), rtol=1e-9, atol=1e-12)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_paths_and_rays_do_not_depend_on_the_rank_count(comm, mode):
    """The render counts its paths (one per pixel sample) and rays (those and every shadow
    and bounce ray, each once) alike on every rank count; the segments forwarded (a ray
    crossing domains is several) differ."""
    opts = options("cpu", mode=mode)
    _, split = raytrace.render(opts, comm)
    if comm.Get_rank() == 0:
        _, whole = raytrace.render(opts, MPI.COMM_SELF)
        assert split["paths"] == whole["paths"] == opts.width * opts.height * opts.samples
        assert split["rays"] == whole["rays"] > split["paths"]
        assert split["segments"] > whole["segments"] and whole["items_between_ranks"] == 0
        assert split["items_between_ranks"] > 0
    comm.Barrier()


@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_the_heap_is_frozen_after_the_first_trace(comm, monkeypatch, mode):
    """A render of one pass freezes the heap once the trace kernel is loaded (after its first
    launch that ran: an empty one loads nothing), so no full collection stops a rank in its
    later rounds (or batches), and unfreezes it at the end."""
    launches = []  # (items, heap frozen) of each trace launch
    heap_frozen = [False]
    real_launch, real_freeze, real_unfreeze = rafi.Forwarder.launch, gc.freeze, gc.unfreeze

    def launch(self, kernel, n, *args):
        if kernel is rt.trace:
            launches.append((n, heap_frozen[0]))
        return real_launch(self, kernel, n, *args)

    def freeze():
        real_freeze()
        heap_frozen[0] = True

    def unfreeze():
        real_unfreeze()
        heap_frozen[0] = False

    monkeypatch.setattr(rafi.Forwarder, "launch", launch)
    monkeypatch.setattr(gc, "freeze", freeze)
    monkeypatch.setattr(gc, "unfreeze", unfreeze)
    opts = options("cpu", mode=mode)
    opts.samples, opts.samples_per_pass = 2, 2
    _, unfrozen = leaves_heap_unfrozen(lambda: raytrace.render(opts, comm))
    first = next(i for i, (n, _) in enumerate(launches) if n)  # every rank traces some rays
    assert not any(frozen for _, frozen in launches[: first + 1])
    assert all(frozen for _, frozen in launches[first + 1 :])
    assert comm.allreduce(len(launches) - first - 1) > 0  # some rank launched it again
    assert unfrozen and not heap_frozen[0]


def test_samples_per_pass_fit_in_memory(comm):
    """Auto: every sample in one pass when they fit, one when even one does not, never more
    in async mode (a fourth record per item) than in rounds; the same on every rank."""
    opts = options("cpu")
    opts.samples = 64
    work = raytrace.work(opts, comm.Get_rank(), comm.Get_size())
    fit = render_loop.samples_per_pass
    assert fit(comm, "cpu", work._replace(capacity=1), opts, "bsp") == 64
    assert fit(comm, "cpu", work._replace(capacity=2**50), opts, "bsp") == 1
    page = render_loop.host_memory_available()
    middle = work._replace(capacity=page // (80 * 3 * rt.Ray.itemsize))  # some 40 fit, shared by the node
    rounds, batches = fit(comm, "cpu", middle, opts, "bsp"), fit(comm, "cpu", middle, opts, "async")
    assert 1 < batches <= rounds < 64
    assert comm.allgather(rounds) == [rounds] * comm.Get_size()


def trace_rays(comm, backend, rays, g, cells):
    """Trace ``rays`` (given on rank 0; one per pixel) through slabs of ``g / size`` columns of
    cells, one per rank, with the example's kernels; return the pixels' sums on rank 0."""
    rank, size = comm.Get_rank(), comm.Get_size()
    domains = [(r * g // size, (r + 1) * g // size, 0, g) for r in range(size)]
    owner = np.repeat(np.arange(size, dtype=np.int32), [(i1 - i0) * g for i0, i1, _, _ in domains])
    with (
        rafi.Reducer(comm, 3 * len(rays), np.float64, backend=backend) as red,
        rafi.Forwarder(comm, rt.Ray, 64, backend=backend) as fwd,
    ):
        if rank == 0:
            fwd.send(rays, owner[rays["cell"][:, 0] * g + rays["cell"][:, 1]])
        sph, dom, own, started = (
            fwd.to_backend(a)
            for a in (
                local_cells(cells, g, domains[rank]),
                np.array(domains[rank]),
                owner,
                np.zeros(1, np.int64),
            )
        )
        while fwd.forward().alive:
            fwd.launch(rt.trace, len(fwd.inbox), fwd.inbox, fwd.outbox, red, sph, dom, own, g, 1, 0, started)
        red.flush()
        return red.gather(root=0)


@pytest.mark.mpi(min_size=2)
def test_a_ray_hitting_the_ground_just_past_a_domain_boundary(comm, backend):
    """A ray crosses from one rank's cells into the next's and hits the ground 4e-7 past the
    boundary (less than the tracer's epsilon). The sender sees the hit outside its cell; the
    receiver must still see it, as one process does (once, it went on to the sky)."""
    g = 2 * comm.Get_size()  # the first boundary is at x = 2 on any rank count
    cells = np.zeros((g * g, 6))  # no spheres: only the ground
    rays = np.zeros(1, rt.Ray)
    dx, dy, t_hit = 0.6, -0.8, 0.5 + 4e-7  # at x = 1.7 + 0.6 t it crosses x = 2 at t = 0.5
    rays["o"] = (1.7, -dy * t_hit, 1.5)
    rays["d"] = (dx, dy, 0.0)
    rays["c"] = 1.0
    i, k, t_next_i, t_next_k = rt.walk_start(1.7, 1.5, dx, 0.0, 0.0, g)
    rays["cell"], rays["next"] = (i, k), (t_next_i, t_next_k)
    split = trace_rays(comm, backend, rays, g, cells)
    whole = trace_rays(MPI.COMM_SELF, backend, rays, g, cells) if comm.Get_rank() == 0 else None
    if comm.Get_rank() == 0:
        r, gg, b = rt.sky(dy)
        assert not np.allclose(whole, [r, gg, b])  # one process sees the ground there
        np.testing.assert_allclose(split, whole, rtol=1e-12)


def test_decomposition_covers_every_cell_once():
    cells = make_scene("spheres", 16, 1)
    for size in (1, 2, 3, 4, 7, 8):
        domains, owner = decompose(cells, 16, size)
        area = sum((i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in domains)
        assert area == 256 and sorted(set(owner.tolist())) == list(range(size))
        spheres = [(cells[owner == r, 0] > 0).sum() for r in range(size)]
        assert max(spheres) - min(spheres) <= 256 // size  # roughly balanced


def test_spheres_stay_inside_their_cells():
    cells = make_scene("dense", 8, 2)
    i, k = np.divmod(np.arange(64), 8)
    r = cells[:, 0]
    assert ((cells[:, 1] - r >= i) & (cells[:, 1] + r <= i + 1)).all()
    assert ((cells[:, 2] - r >= k) & (cells[:, 2] + r <= k + 1)).all()


def test_png_written(tmp_path):
    path = tmp_path / "x.png"
    to_png(np.full((4, 5, 3), 0.5), path)
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (5, 4)
