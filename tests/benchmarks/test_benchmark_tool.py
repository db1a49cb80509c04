"""The lambda layer benchmark (benchmarks/) and its command line tools/benchmark_lambda.py:
every candidate it times builds and maps the feature map to its own shape, and a run writes its
table, JSON and plot; tools/count_kernels.py counts kernels. (Its timings are not tested:
docs/benchmarks.md.)
"""

import json
from pathlib import Path

import pytest
import torch

from benchmarks import candidates as zoo
from benchmarks import count_kernels
from benchmarks import lambda_layer as benchmark_lambda
from lambda_det import layers


def run_benchmark(out: Path, *args: str) -> dict:
    """tools/benchmark_lambda.py with ``args``, no warm-up, writing to ``out``: its results.json."""
    assert benchmark_lambda.main([*args, "--warmup", "0", "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


def test_layer_sizes_are_the_layers_defaults():
    assert (zoo.HEADS, zoo.DIM_K, zoo.DIM_U, zoo.SCOPE) == (4, 16, 1, 23)
    assert (zoo.AFT_HEADS, zoo.AFT_WINDOW) == (8, 7)


@pytest.mark.slow
def test_every_candidate_builds_and_keeps_the_shape():
    pytest.importorskip("timm")
    pytest.importorskip("lambda_networks")
    candidates = zoo.layer_candidates(6, 10, 32, 2, cap_bytes=2**30)
    names = [candidate.name for candidate in candidates]
    for impl in layers.IMPLEMENTATIONS:
        assert f"lambda_det {impl}" in names
    for expected in (
        zoo.TIMM,
        zoo.LUCIDRAINS,
        "conv 3x3",
        "self-attention sdpa",
        "AFT-simple",
        "AFT-full",
        f"AFT-local s={zoo.SCOPE}",
        f"AFT-conv h=8 s={zoo.AFT_WINDOW}",
    ):
        assert expected in names
    with pytest.raises(ValueError, match=r"--only \['nosuch'\] matches none of the candidates"):
        zoo.layer_candidates(6, 10, 32, 2, cap_bytes=2**30, only=["nosuch"])
    x = torch.randn(2, 32, 6, 10, requires_grad=True)
    for candidate in candidates:
        assert candidate.skip is None, candidate.name
        module = candidate.build().train()
        output = module(x)
        assert output.shape == x.shape, candidate.name
        output.square().mean().backward()


def test_memory_cap_skips_with_the_reason():
    candidates = zoo.layer_candidates(64, 64, 256, 2, cap_bytes=2**20, only=["einsum", "explicit"])
    assert [c.name for c in candidates] == ["lambda_det einsum", "self-attention explicit"]
    assert all(c.skip and c.skip.startswith("too large") for c in candidates)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_small_run_writes_table_json_and_plot(tmp_path):
    only = ["--only", "tiled", "conv 3x3", "AFT-simple"]
    results = run_benchmark(tmp_path, "--shapes", "c5_224", *only, "--repetitions", "1")
    timed = results["shapes"]["c5_224"]
    assert "lambda_det tiled" in (tmp_path / "results.md").read_text()
    assert "AFT-simple" in json.dumps(timed)
    assert results["tiled_tile"] == [4, 4]
    assert (tmp_path / "results.png").stat().st_size > 0


@pytest.mark.e2e
def test_tile_reaches_the_tiled_layers_and_changes_nothing_else(tmp_path):
    (candidate,) = zoo.layer_candidates(8, 8, 16, 1, cap_bytes=2**30, only=["tiled"], tile=(2, 3))
    assert candidate.build().tuning.tile == (2, 3)
    results = run_benchmark(
        tmp_path, "--shapes", "c5_224", "--only", "tiled", "--tile", "2", "3", "--repetitions", "1"
    )
    assert results["tiled_tile"] == [2, 3]
    assert layers.LambdaLayer(16).tuning.tile == ()  # no default was rewritten


@pytest.mark.slow
@pytest.mark.e2e
def test_backbone_mode_times_every_round_it_is_asked_for(tmp_path):
    # An explicit --repetitions equal to the layer default once got replaced by the backbone's.
    results = run_benchmark(
        tmp_path, "--backbone", "--depth", "26", "--image", "64", "--repetitions", "7"
    )
    lambda_row, baseline_row = results["rows"]
    assert len(lambda_row["times_s"]) == len(baseline_row["times_s"]) == 7
    ratios = sorted(a / b for a, b in zip(lambda_row["times_s"], baseline_row["times_s"]))
    assert lambda_row["ratio_to_baseline"] == pytest.approx(ratios[3])
    assert baseline_row["ratio_to_baseline"] == pytest.approx(1.0)
    assert "x baseline time" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_blocks_mode_pairs_each_lambda_block_with_its_conv_block(tmp_path):
    rows = run_benchmark(
        tmp_path, "--blocks", "--depth", "26", "--image", "64", "--repetitions", "2"
    )["rows"]
    assert [(row["name"], row["count"], row["input"]) for row in rows] == [
        ("c4 block", 1, [1, 1024, 4, 4]),
        ("c5 first block (stride 2)", 1, [1, 1024, 4, 4]),
        ("c5 block", 1, [1, 2048, 2, 2]),
    ]
    assert all(len(row["lambda_times_s"]) == len(row["conv_times_s"]) == 2 for row in rows)
    assert "c5 first block (stride 2)" in (tmp_path / "results.md").read_text()


@pytest.mark.e2e
def test_count_kernels_counts_compute_ops_not_views():
    tool = count_kernels
    layer = layers.LambdaLayer(8, heads=2, dim_k=4, scope=3, impl="conv")
    x = torch.randn(1, 8, 5, 5, requires_grad=True)
    forward, backward, names = tool.count_kernels(layer, x)
    assert forward > 0 and backward > 0 and forward + backward == sum(names.values())
    assert names["convolution"] == 2 and names["convolution_backward"] == 2  # projection, lambdas
    assert not set(names) & tool.NO_KERNEL
    assert tool.main(["--size", "8", "--channels", "16"]) == 0
