"""Calibration sharded over a Dask cluster (``distributed``, Debian's
python3-distributed): each worker calibrates one shard of the data and sends
back its statistics file; the client merges them in shard order and quantizes.
With MinMax or NonOverflow the model written equals, byte for byte, the one a
single process calibrating on all the data writes; histograms (Percentile,
Entropy, MinMSE) merge within one bin (docs/large-models.md).

What travels: the recipe and model paths, the shard descriptions (data paths,
or whatever ``reader`` turns into a CalibrationDataReader on the worker), and
the statistics files' text back to the client. No tensor crosses the network;
workers must see the model and their shards at the paths given, and have vaiq
installed (the same wheel).

A worker that dies mid-shard (killed, out of memory) loses nothing: Dask's
scheduler runs the shard again on another worker (up to its
``distributed.scheduler.allowed-failures``, 3 by default), and a shard's
statistics depend only on its data.
"""

import os
import tempfile
import uuid

from . import _absolute_paths, _paths, calibrate, run_recipe

__all__ = ["calibrate_shard", "calibrate_sharded"]


def calibrate_shard(recipe, shard, reader=None, overrides=None, settings=None):
    """On a worker: calibrates ``shard`` as ``recipe`` says and returns the
    statistics file's text. ``shard`` is a data path, or given to
    ``reader(shard)`` for a CalibrationDataReader when ``reader`` is set."""
    data = reader(shard) if reader is not None else shard
    with tempfile.TemporaryDirectory(prefix="vaiq-shard-") as scratch:
        path = os.path.join(scratch, "statistics.json")
        calibrate(recipe, data, path, overrides=overrides, **(settings or {}))
        with open(path, encoding="utf-8") as f:
            return f.read()


def calibrate_sharded(client, recipe, shards, output=None, work_dir=None, reader=None, overrides=None,
                      quantize=True, **settings):
    """Calibrates each of ``shards`` on a Dask worker of ``client``, writes the
    statistics files to ``work_dir`` (``shard-<i>.json``, in shard order) and,
    with ``quantize``, quantizes from their merge into ``output`` as
    :func:`vaiq.run_recipe` does. ``settings`` and ``overrides`` apply to every
    shard and to the run (``model_input=...``). Returns the run's report, or
    the statistics paths when ``quantize`` is False.

    ``recipe`` and every path are resolved on the client and must be readable
    at the same absolute paths on the workers (a shared file system, or the
    same layout on every machine).
    """
    shards = list(shards)
    if not shards:
        raise ValueError("calibrate_sharded: no shards given")
    if quantize and output is None:
        raise ValueError("calibrate_sharded: give the output model path (or quantize=False)")
    settings = _absolute_paths(settings)
    recipe = _recipe_path(recipe)
    shards = [os.path.abspath(os.fspath(s)) if reader is None else s for s in shards]
    work_dir = os.path.abspath(work_dir or tempfile.mkdtemp(prefix="vaiq-shards-"))
    os.makedirs(work_dir, exist_ok=True)

    run = uuid.uuid4().hex[:8]
    futures = [
        client.submit(calibrate_shard, recipe, shard, reader, overrides, settings, key=f"vaiq-shard-{run}-{i}",
                      pure=False) for i, shard in enumerate(shards)
    ]
    texts = client.gather(futures)
    files = []
    for i, text in enumerate(texts):
        path = os.path.join(work_dir, f"shard-{i}.json")
        partial = path + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(partial, path)
        files.append(path)
    if not quantize:
        return files
    return run_recipe(recipe, overrides=overrides, statistics=_paths(files), model_output=output, **settings)


def _recipe_path(recipe):
    """A recipe path as the workers will see it: absolute when it names a file
    here, a bare shipped recipe's name otherwise."""
    recipe = os.fspath(recipe)
    return os.path.abspath(recipe) if os.path.exists(recipe) else recipe
