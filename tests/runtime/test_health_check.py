"""The probe's health check (training/health_check.py): what it compares, and a real run under torchrun on the CPU,
where only the figures that TIERED_TRAINING_HEALTH_EXPECT gives are compared (never GPU figures with CPU ones)."""

from __future__ import annotations

import pytest

from training.health_check import Expected, RankFigures, problems

from .helpers import tiny_config


def test_a_rank_below_its_figure_is_named_with_its_host_gpu_and_figure():
    figures = [RankFigures("algo-1", 0, 700.0, 150.0, 40.0), RankFigures("algo-1", 1, 710.0, 151.0, 41.0),
               RankFigures("algo-2", 0, 690.0, 149.0, 40.5), RankFigures("algo-2", 1, 310.0, 150.0, 39.0)]
    expected = Expected(matmul_tflops=494.5, node_gbps=135.0, world_gbps=None, source="the catalogue's p5")
    assert problems(figures, expected) == [
        "algo-2 GPU 1: 310.0 TFLOP/s matmul, below the 494.5 expected (the catalogue's p5)"]
    assert problems(figures[:3], expected) == []


def test_catalogue_figures_come_from_the_plans_hardware():
    hardware = tiny_config().hardware.model_copy(update={
        "instance_type": "ml.p5.48xlarge", "gpus_per_node": 8, "peak_bf16_flops": 989e12,
        "nvlink_bytes_per_s": 450e9, "network_bits_per_s": 3200e9})
    expected = Expected.from_catalogue(hardware)
    assert expected.matmul_tflops == pytest.approx(494.5)
    assert expected.node_gbps == pytest.approx(135.0)
    assert expected.world_gbps == pytest.approx(0.25 * 3200 / 8 / 8)
    assert Expected.from_environment({}) is None
    assert Expected.from_environment({"TIERED_TRAINING_HEALTH_EXPECT": "matmul_tflops=1e6"}).matmul_tflops == 1e6
    with pytest.raises(ValueError, match="NAME=VALUE"):
        Expected.from_environment({"TIERED_TRAINING_HEALTH_EXPECT": "speed=fast"})
