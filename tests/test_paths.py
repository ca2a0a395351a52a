"""core.paths: where the checkout is, and paths written relative to it."""

from draftlab.core.paths import repo_relative, repo_root


def test_repo_relative_writes_checkout_paths_relative_and_others_as_given(tmp_path):
    root = repo_root()
    assert root is not None  # the tests run from an editable checkout
    assert repo_relative(root / "results" / "study-x") == "results/study-x"
    assert repo_relative(tmp_path / "study") == str(tmp_path / "study")
