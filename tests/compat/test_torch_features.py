"""The torch features that differ between torch releases, found by feature detection."""

import pytest
import torch

from lambda_det.compat import torch_features


def test_is_exporting_is_torchs_own_where_torch_has_it():
    if torch_features.HAS_IS_EXPORTING:
        assert torch_features.is_exporting is torch.compiler.is_exporting
    else:
        assert torch_features.is_exporting is torch_features._never_exporting
    assert torch_features.is_exporting() is False  # eager: no export runs


def test_the_stand_in_for_is_exporting_is_scriptable():
    scripted = torch.jit.script(torch_features._never_exporting)
    assert scripted() is False


@pytest.mark.skipif(
    not torch_features.HAS_IS_EXPORTING, reason="needs torch.compiler.is_exporting (torch>=2.6)"
)
def test_is_exporting_is_true_under_torch_export():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch_features.is_exporting())
            return x + 1

    torch.export.export(Probe(), (torch.ones(2),))
    assert True in seen


def test_has_free_unbacked_symbols_of_plain_sizes_is_false():
    assert torch_features.has_free_unbacked_symbols(3) is False
    assert torch_features.has_free_unbacked_symbols(torch.ones(2, 3).shape) is False


def test_pt2_flag_matches_the_module():
    assert torch_features.HAS_PT2_ARCHIVE == (torch_features.pt2_package is not None)
    if torch_features.HAS_PT2_ARCHIVE:
        assert hasattr(torch_features.pt2_package, "PT2ArchiveReader")


def test_a_torch_below_the_floor_stops_in_one_line(monkeypatch):
    torch_features.check_torch_floor()  # negative control: this torch is at or above the floor
    monkeypatch.setattr(torch_features, "FLOOR_MODULE", "torch.no_such_module_for_the_test")
    with pytest.raises(ImportError) as raised:
        torch_features.check_torch_floor()
    message = str(raised.value)
    assert "\n" not in message
    assert "lambda_det needs torch>=2.5" in message and "pip install 'torch>=2.5'" in message


def test_the_fake_kernel_probe_answers_alike_and_leaves_nothing_behind():
    # A probe operator left registered would make the next probe's define raise.
    assert torch_features.fake_kernels_stack.__wrapped__() is torch_features.fake_kernels_stack()
    assert torch_features.fake_kernels_stack.__wrapped__() is torch_features.fake_kernels_stack()
