"""The planner reproduces the design digest's memory numbers, and the command prints them."""

from __future__ import annotations

import re

import pytest

from distdoctor.cli.main import main
from distdoctor.memory.formulas import PRECISIONS, deepspeed_estimate, stage_bytes
from distdoctor.memory.planner import Model, cheapest_fit, smallest_world_size

pytestmark = pytest.mark.tier("unit")

FP32, MIXED, MASTER = (PRECISIONS[k] for k in ("fp32", "mixed", "mixed-master"))
P = 70e9


def test_vanilla_mixed_precision_is_16_bytes_per_parameter():
    assert stage_bytes(0, P, 8, MASTER).total == pytest.approx(16 * P)


def test_zero1_is_4p_plus_12p_over_n_a_65_percent_drop_at_8():
    zero1 = stage_bytes(1, P, 8, MASTER).total
    assert zero1 == pytest.approx(5.5 * P)
    assert 1 - zero1 / (16 * P) == pytest.approx(0.65625)


def test_adam_moments_for_70b_in_fp32_are_560_gb():
    assert stage_bytes(0, P, 1, FP32).optimizer == pytest.approx(560e9)


def test_mixed_precision_saves_a_quarter_not_half_on_7b():
    fp32, mixed = stage_bytes(0, 7e9, 1, FP32).total, stage_bytes(0, 7e9, 1, MIXED).total
    assert (fp32, mixed) == (pytest.approx(112e9), pytest.approx(84e9))
    assert 1 - mixed / fp32 == pytest.approx(0.25)


def test_70b_fsdp_on_8_gpus_is_105_gb_and_16_gpus_fit_80():
    assert stage_bytes(3, P, 8, MIXED).total == pytest.approx(105e9)
    assert stage_bytes(3, P, 16, MIXED).total == pytest.approx(52.5e9)
    assert smallest_world_size(Model(P), 3, MIXED, 80e9) == 11  # 840 GB / 80 GB, rounded up


def test_deepspeed_estimators_and_where_ours_differ():
    n, layer = 8, 1e9
    assert deepspeed_estimate(2, P, n) == pytest.approx(2 * P + 18 * P / n)
    assert deepspeed_estimate(3, P, n, layer) == pytest.approx(4 * layer + 18 * P / n)
    ours2 = stage_bytes(2, P, n, MASTER).total
    ours3 = stage_bytes(3, P, n, MASTER, largest_layer=layer).total
    assert deepspeed_estimate(2, P, n) - ours2 == pytest.approx(4 * P / n)  # fp32 grad partition
    assert deepspeed_estimate(3, P, n, layer) - ours3 == pytest.approx(2 * P / n)


def test_the_hand_rolled_fix_search_prefers_a_stage_then_ranks():
    """The run-level fault: 450 parameters, 4 layers, the largest 272, fp32 Adam, a budget
    of 8 bytes per parameter."""
    model = Model(450, 272, layers=4, counters=16)
    on_four = cheapest_fit(model, 1, 4, FP32, 8 * 450)
    assert (on_four.stage, on_four.world_size) == (2, 4)
    on_two = cheapest_fit(model, 1, 2, FP32, 8 * 450)
    assert (on_two.stage, on_two.world_size) == (2, 4)  # nothing fits on 2 or 3 ranks


def test_memory_command_reports_the_overrun_and_the_fixes(capsys):
    assert main(["memory", "--params", "70e9", "--world-size", "8", "--stage", "3",
                 "--budget-gb", "80"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "105.0 GB" in out and "over by 25.0 GB" in out
    assert "11 ranks fit (76.4 GB per rank)" in out
    assert "16 ranks (52.5 GB per rank)" in out
    assert "activation checkpointing" in out and "105.0 GB of model states stay" in out
    assert "ZeRO-3 4L + 18P/N = 157.5 GB" in out


def test_a_higher_stage_on_the_same_ranks_is_offered_first(capsys):
    """7B in mixed precision (12 bytes a parameter) on 8 ranks with 40 GB each: DDP needs
    84 GB; ZeRO-1 shards only m and v, 2P + 2P + 8P/8 = 5P = 35 GB, and fits."""
    assert main(["memory", "--params", "7e9", "--world-size", "8", "--stage", "0",
                 "--budget-gb", "40"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "needs 84.0 GB per rank" in out
    assert "a higher stage on 8 ranks: 1 ZeRO-1 (35.0 GB per rank)" in out


def test_memory_command_table_for_every_stage(capsys):
    assert main(["memory", "--params", "70B", "--precision", "mixed-master"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("1 ZeRO-1"))
    assert "385.0 GB" in row and "5.5P" in row and "-65.6%" in row
    assert "1120.0 GB" in out  # vanilla: 16 bytes per parameter


@pytest.mark.parametrize("argv", [["--params", "-5"], ["--params", "lots"],
                                  ["--params", "7B", "--stage", "4"],
                                  ["--params", "7B", "--world-size", "0"],
                                  ["--params", "7B", "--budget-gb", "-1"]])
def test_memory_command_rejects_bad_input_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["memory", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err


@pytest.mark.parametrize("world_size, tp, stage, total_gb", [
    # 12 bytes per parameter (mixed): tensor parallelism over 8 splits every weight 8 ways,
    # 12P/8 = 105 GB, as ZeRO-3 over 8 data-parallel ranks does
    (8, 8, "0", 70e9 * 12 / 8 / 1e9),
    # TP 8 x DP 2, ZeRO-1: parameters and gradients 4P/8, Adam's m and v 8P/(8 x 2)
    (16, 8, "1", (70e9 * 4 / 8 + 70e9 * 8 / 16) / 1e9),
    # TP 2 x DP 4, ZeRO-3: all 12P/(2 x 4)
    (8, 2, "3", 70e9 * 12 / 8 / 1e9),
])
def test_a_tensor_parallel_degree_splits_the_weights_before_zero_shards_them(
        world_size, tp, stage, total_gb, capsys):
    assert main(["memory", "--params", "70e9", "--world-size", str(world_size), "--tp", str(tp),
                 "--stage", stage]) == 0
    printed = capsys.readouterr().out
    assert f"tensor-parallel over {tp}" in " ".join(printed.split())
    row = next(line for line in printed.splitlines() if line.startswith(stage + " "))
    total = re.search(r"([\d.]+) GB\s+[\d.]+P\s", row)[1]  # the column before "per param"
    assert float(total) == pytest.approx(total_gb, abs=0.05)


def test_a_tensor_parallel_degree_that_leaves_a_node_is_refused(capsys):
    assert main(["memory", "--params", "70e9", "--world-size", "8", "--tp", "16"]) == 2
    assert "--tp 16 must divide --world-size 8" in capsys.readouterr().err
