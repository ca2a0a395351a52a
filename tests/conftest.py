"""Shared test set-up: markers that skip themselves where the machine cannot run them."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_target():
    from draftlab.model.target import load_target

    return load_target("tiny", device="cpu")


@pytest.fixture(scope="session")
def embedded_target():
    from draftlab.model.target import load_target

    return load_target("embedded", device="cpu")
