"""Sharded calibration on a local Dask cluster of two worker processes: the
model equals, byte for byte, the one calibrated on all the data in one process,
also when a worker dies mid-shard and Dask runs its shard again."""

import filecmp
import json
import os
import pathlib

import numpy as np
import pytest

import vaiq
import vaiq.distributed

distributed = pytest.importorskip("distributed", reason="Debian's python3-distributed is not installed")

SOURCE = pathlib.Path(os.environ.get("VAIQ_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
EXAMPLE = SOURCE / "examples" / "mnist"
MODEL = EXAMPLE / "mnist_cnn.onnx"


def shard_reader(dies_once_at=None, marker=None):
    """A reader factory the workers call with a shard's path: one image a batch.
    With a marker path, the first process to reach batch `dies_once_at` of a
    shard leaves the marker and exits at once, as a killed worker would."""

    def reader(shard):
        import numpy
        import os

        class ShardReader:
            def __init__(self):
                self.images = numpy.load(shard)
                self.position = 0

            def get_next(self):
                if self.position == dies_once_at and marker and not os.path.exists(marker):
                    open(marker, "w").close()
                    os._exit(1)
                if self.position >= len(self.images):
                    return None
                self.position += 1
                return {"pixels": self.images[self.position - 1:self.position]}

        return ShardReader()

    return reader


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    images = np.load(EXAMPLE / "calibration.npy")
    paths = [folder / "a.npy", folder / "b.npy", folder / "all.npy"]
    np.save(paths[0], images[:120])
    np.save(paths[1], images[120:])
    np.save(paths[2], images)
    return paths


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c
            c.wait_for_workers(2, timeout=60)  # a restarted worker is up before the cluster closes


def test_two_shards_write_the_model_one_process_writes(client, shards, tmp_path):
    a, b, everything = shards
    one = tmp_path / "one_process.onnx"
    vaiq.run_recipe("cpu.yaml", everything, model_input=MODEL, model_output=one)
    report = vaiq.distributed.calibrate_sharded(client, "cpu.yaml", [a, b], tmp_path / "sharded.onnx",
                                                work_dir=tmp_path / "statistics", model_input=MODEL)
    assert filecmp.cmp(one, tmp_path / "sharded.onnx", shallow=False)
    files = report["calibration"]["statistics_files"]
    assert [os.path.basename(f) for f in files] == ["shard-0.json", "shard-1.json"]
    assert [json.load(open(f))["batches"] for f in files] == [1, 1]

    # The same statistics merged into one file quantize to the same model too.
    merged = tmp_path / "merged.json"
    counts = vaiq.merge_statistics(files, merged, "cpu.yaml", model_input=MODEL)
    assert counts["tensors"] > 0 and counts["batches"] == 2
    vaiq.run_recipe("cpu.yaml", statistics=[merged], model_input=MODEL, model_output=tmp_path / "from_merged.onnx")
    assert filecmp.cmp(one, tmp_path / "from_merged.onnx", shallow=False)


def test_a_worker_that_dies_mid_shard_is_retried_without_changing_the_model(client, shards, tmp_path):
    a, b, everything = shards
    one = tmp_path / "one_process.onnx"
    vaiq.run_recipe("cpu.yaml", shard_reader()(str(everything)), model_input=MODEL, model_output=one)
    marker = tmp_path / "a_worker_died"
    report = vaiq.distributed.calibrate_sharded(client, "cpu.yaml", [str(a), str(b)], tmp_path / "sharded.onnx",
                                                reader=shard_reader(dies_once_at=7, marker=str(marker)),
                                                model_input=MODEL)
    assert marker.exists(), "no worker died: the test did not test the retry"
    assert report["calibration"]["batches"] == len(np.load(everything))
    assert filecmp.cmp(one, tmp_path / "sharded.onnx", shallow=False)


def test_statistics_of_another_model_are_refused(client, shards, tmp_path):
    a, b, _ = shards
    files = vaiq.distributed.calibrate_sharded(client, "cpu.yaml", [a], work_dir=tmp_path, quantize=False,
                                               model_input=MODEL)
    with pytest.raises(ValueError, match="shard-0.json"):
        vaiq.run_recipe("cnn_npu.yaml", statistics=files, model_input=MODEL, model_output=tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="no shards"):
        vaiq.distributed.calibrate_sharded(client, "cpu.yaml", [], tmp_path / "y.onnx", model_input=MODEL)
