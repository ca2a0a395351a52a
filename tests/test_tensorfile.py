"""core.tensorfile writes a tensor from its parts as an ordinary safetensors file: what safetensors' own
readers (load_file, safe_open's slices, as training reads shards) give back is the parts joined."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from draftlab.core.tensorfile import write_parts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_parts_read_back_joined_by_safetensors_own_readers(tmp_path, dtype):
    torch.manual_seed(0)
    aux = [torch.randn(n, 12).to(dtype) for n in (3, 1, 7)]
    last = torch.randn(11, 4).to(dtype).t().contiguous().t()  # a non-contiguous whole tensor
    path = write_parts(tmp_path / "x.safetensors", {"aux": aux, "last": last})
    got = load_file(str(path))
    assert torch.equal(got["aux"], torch.cat(aux)) and torch.equal(got["last"], last) and got["aux"].dtype == dtype
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(f.get_slice("aux")[3:4], aux[1])  # one sample's rows, as OfflineHidden.get reads
    assert (path.stat().st_size - 8) % 8 == 0  # header padded: the data starts 8-byte aligned


def test_parts_that_do_not_join_are_refused(tmp_path):
    with pytest.raises(ValueError, match="aux: parts differ"):
        write_parts(tmp_path / "x.safetensors", {"aux": [torch.zeros(2, 3), torch.zeros(2, 4)]})
    with pytest.raises(ValueError, match="aux: parts differ"):
        write_parts(tmp_path / "x.safetensors", {"aux": [torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float16)]})
