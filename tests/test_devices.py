"""The device table (tinygrad_ckpt/devices.py): each GPU's reported memory, what is left for tensors, and the
names people write for them."""

import pytest

from tinygrad_ckpt.scale.devices import CUDA_OVERHEAD, DEVICES, Device, parse_gpu, usable_bytes

MiB, GiB = 2**20, 2**30


def test_the_table_holds_the_cards_the_issue_names():
    assert set(DEVICES) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200", "RTX-4090", "RTX-3090"}
    for device in DEVICES.values():
        assert device.source and device.reports.startswith("NVIDIA ")


def test_reported_memory_is_below_the_marketed_size():
    # an "80 GB" card (80 GiB of memory chips) reports 79.2-79.3 GiB: the driver keeps the rest
    for name, gib in (("A100-40GB", 40), ("A100-80GB", 80), ("H100-80GB", 80), ("H200", 141), ("RTX-4090", 24),
                      ("RTX-3090", 24)):
        assert 0.95 * gib * GiB < DEVICES[name].total_bytes < gib * GiB, name
    assert DEVICES["H100-80GB"].total_bytes == 85_045_477_376  # deviceQuery: 81106 MBytes
    assert round(DEVICES["H100-80GB"].total_bytes / GiB, 1) == 79.2


def test_usable_bytes_is_the_reported_memory_less_the_cuda_overhead():
    assert CUDA_OVERHEAD == 512 * MiB
    assert usable_bytes("H100-80GB") == 85_045_477_376 - 512 * MiB == 84_508_606_464
    assert usable_bytes("A100-40GB") == 42_405_855_232 - 512 * MiB
    measured = Device("H100-80GB", "NVIDIA H100 80GB HBM3", 85_045_477_376, "a run", overhead_bytes=600 * MiB)
    assert parse_gpu(measured) is measured and measured.usable_bytes == 85_045_477_376 - 600 * MiB


@pytest.mark.parametrize("text, name", [
    ("H100-80GB", "H100-80GB"), ("h100 80gb", "H100-80GB"), ("H100_80GB", "H100-80GB"), ("h100", "H100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("nvidia a100-sxm4-80gb", "A100-80GB"), ("a100 40gb", "A100-40GB"),
    ("H200", "H200"), ("h200-141gb", "H200"), ("rtx4090", "RTX-4090"), ("NVIDIA GeForce RTX 3090", "RTX-3090"),
    (" RTX 3090 ", "RTX-3090"),
])
def test_names_as_people_write_them(text, name):
    assert parse_gpu(text).name == name


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'V100': known are A100-40GB, A100-80GB, H100-80GB, H200"):
        parse_gpu("V100")
    with pytest.raises(ValueError, match="A100-40GB or A100-80GB"):
        parse_gpu("A100")
