"""benchmarks/ab_decode_kernels.py and benchmarks/_decode_variants.py without a GPU: a revision's kernels are read
from git and imported with both kernels, a file's likewise, `swapped` puts another version's kernels in place and
always restores the tree's, and every CLI mistake is one message naming the argument."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_exits_needing_a_gpu, load_benchmark

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
ab = load_benchmark("ab_decode_kernels")
variants = load_benchmark("_decode_variants")

in_git = shutil.which("git") is not None and subprocess.run(
    ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, check=False).returncode == 0
needs_git = pytest.mark.skipif(not in_git, reason="reads a revision: needs a git checkout")


@needs_git
def test_a_revisions_kernels_come_from_git_and_import_with_both_kernels(tmp_path):
    source = ab.sources(["HEAD"], [])["at HEAD"]
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:backends/triton_moe/_gemv_kernels.py"],
                               capture_output=True, text=True, check=True).stdout
    assert source == committed
    module = variants.import_kernels("at HEAD", source, str(tmp_path))
    assert (tmp_path / "gemv_variant_at_HEAD.py").read_text() == committed
    assert isinstance(module.gemv1_act_kernel, triton.runtime.JITFunction)
    assert isinstance(module.gemv2_sum_kernel, triton.runtime.JITFunction)


def test_a_variant_file_is_named_by_its_file(tmp_path):
    copy = tmp_path / "my_kernels.py"
    copy.write_text(variants.KERNELS.read_text())
    assert ab.sources([], [str(copy)]) == {"my_kernels.py": variants.KERNELS.read_text()}


def test_swapped_puts_the_versions_kernels_in_place_and_always_restores_the_trees(tmp_path):
    import backends.triton_moe._gemv_kernels as tree
    from backends.triton_moe import forward

    other = variants.import_kernels("copy", variants.KERNELS.read_text(), str(tmp_path))
    before = tree.gemv1_act_kernel, tree.gemv2_sum_kernel, forward.DECODE_MAXNREG
    with pytest.raises(RuntimeError, match="inside"):
        with variants.swapped(other, maxnreg=64):
            assert tree.gemv1_act_kernel is other.gemv1_act_kernel
            assert tree.gemv2_sum_kernel is other.gemv2_sum_kernel
            assert forward.DECODE_MAXNREG == 64
            raise RuntimeError("inside")
    assert (tree.gemv1_act_kernel, tree.gemv2_sum_kernel, forward.DECODE_MAXNREG) == before
    with variants.swapped(other):
        assert forward.DECODE_MAXNREG == before[2]  # no maxnreg: the tree's cap


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to compare: give --against REV or --variant FILE"),
    (["--against", "HEAD", "--layers", "gpt-oss-120b,no-such-model"], "unknown ['no-such-model']"),
    (["--against", "HEAD", "--tokens", "1,4"], "--tokens '1,4': give T from (1, 2)"),
    (["--against", "HEAD", "--tokens", "one"], "--tokens 'one': give T from (1, 2)"),
    (["--variant", "no/such/file.py"], "--variant 'no/such/file.py': no such file"),
])
def test_each_cli_mistake_is_one_message_naming_the_argument(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        ab.main(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@needs_git
def test_an_unknown_revision_is_named(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        ab.main(["--out", str(tmp_path), "--against", "no-such-revision"])
    assert exc.value.code == 2
    assert "revision 'no-such-revision': no backends/triton_moe/_gemv_kernels.py there" in capsys.readouterr().err


@needs_git
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert_exits_needing_a_gpu(ab.main, ["--out", str(tmp_path), "--against", "HEAD"], capsys)
