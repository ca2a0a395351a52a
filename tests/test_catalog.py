"""The catalog snapshot, live discovery (faked Hub answers; offline fallback), and the scoring."""

import time

import pytest
import yaml
from huggingface_hub.hf_api import DatasetInfo

from draftlab.dataset_discovery import catalog as C
from draftlab.dataset_discovery import cli as discover_cli

NAMED_IN_ISSUE = [
    "nvidia/OpenCodeInstruct",
    "m-a-p/Code-Feedback",
    "ise-uiuc/Magicoder-Evol-Instruct-110K",
    "ise-uiuc/Magicoder-OSS-Instruct-75K",
    "cognitivecomputations/dolphin-coder",
    "sahil2801/CodeAlpaca-20k",
    "TokenBender/code_instructions_122k_alpaca_style",
    "theblackcat102/evol-codealpaca-v1",
    "glaiveai/glaive-code-assistant",
    "bigcode/commitpackft",
    "OpenCoder-LLM/opc-sft-stage1",
    "OpenCoder-LLM/opc-sft-stage2",
    "iamtarun/python_code_instructions_18k_alpaca",
    "anon8231489123/ShareGPT_Vicuna_unfiltered",
    "HuggingFaceH4/ultrachat_200k",
    "teknium/OpenHermes-2.5",
    "open-thoughts/OpenThoughts-114k",
]


@pytest.fixture(scope="module")
def catalog():
    return C.load_catalog()


def test_catalog_has_every_named_dataset_with_all_fields(catalog):
    ids = {e["hub_id"] for e in catalog}
    assert set(NAMED_IN_ISSUE) <= ids
    assert any(e["category"] == "agentic coding" for e in catalog)
    assert {e["category"] for e in catalog} == set(C.CATEGORIES)
    for e in catalog:
        assert all(e[f] not in (None, "") for f in C.REQUIRED_FIELDS), e["hub_id"]


def test_malformed_catalog_names_entry_and_field(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"datasets": [{"hub_id": "a/b", "name": "b", "category": "reasoning"}]}))
    with pytest.raises(C.CatalogError, match=r"datasets\[0\] \(a/b\): missing field\(s\) \['rows'"):
        C.load_catalog(path)
    entry = {f: "unknown" for f in C.REQUIRED_FIELDS} | {
        "hub_id": "a/b",
        "category": "reasoning",
        "schema": "csv-ish",
        "turns": "single",
    }
    path.write_text(yaml.safe_dump({"datasets": [entry]}))
    with pytest.raises(C.CatalogError, match="schema 'csv-ish' has no adapter"):
        C.load_catalog(path)


def test_discovery_says_it_uses_the_snapshot_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = C.discover()
    assert not found.online and "catalog snapshot" in found.message and "HF_HUB_OFFLINE" in found.message


def test_discovery_fails_fast_when_the_hub_does_not_answer(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    t = time.time()
    found = C.discover(timeout_s=2)
    assert time.time() - t < 5
    assert not found.online and "127.0.0.1:9 did not answer" in found.message and "snapshot" in found.message


class FakeApi:
    """Answers list_datasets like the Hub does (DatasetInfo built from the Hub's JSON shape)."""

    def __init__(self):
        self.calls = []

    def list_datasets(self, search, sort, limit, full):
        self.calls.append((search, sort, limit, full))
        return [
            DatasetInfo(
                id="m-a-p/Code-Feedback",
                downloads=5000,
                likes=170,
                tags=["license:apache-2.0"],
                cardData={"license": "apache-2.0", "size_categories": ["10K<n<100K"], "language": ["en"]},
            ),
            DatasetInfo(
                id="HuggingFaceH4/ultrachat_200k",
                downloads=90000,
                likes=500,
                tags=["license:mit", "size_categories:100K<n<1M"],
            ),
            DatasetInfo(
                id="someone/new-code-set",
                downloads=10,
                likes=1,
                tags=["license:cc-by-nc-4.0", "size_categories:1K<n<10K", "language:en"],
            ),
        ][:limit]


def test_live_discovery_enriches_and_extends(catalog):
    api = FakeApi()
    found = C.discover(keywords=["code"], limit=10, api=api)
    assert found.online and api.calls == [("code", "downloads", 10, True)]
    merged = {e["hub_id"]: e for e in C.enrich(catalog, found)}
    assert merged["m-a-p/Code-Feedback"]["downloads"] == 5000
    assert merged["HuggingFaceH4/ultrachat_200k"]["license"] == "mit"  # was unknown in the snapshot
    new = merged["someone/new-code-set"]
    assert new["category"] == "discovered" and new["license"] == "cc-by-nc-4.0" and new["schema"] == "unknown"
    table = C.score(list(merged.values()))
    row = table[table.hub_id == "someone/new-code-set"].iloc[0]
    assert "non-commercial" in row.reasons and "no adapter" in row.reasons


def test_score_ranks_with_reasons(catalog):
    table = C.score(catalog, C.Workload(domain="code", multi_turn=True))
    assert list(table.score) == sorted(table.score, reverse=True)
    top = table.iloc[0]
    for part in ("license", "size", "format", "turns", "domain"):
        assert part in top.reasons
    code = table[table.hub_id == "m-a-p/Code-Feedback"].score.item()
    chat = table[table.hub_id == "anon8231489123/ShareGPT_Vicuna_unfiltered"].score.item()
    assert code > chat
    chat_table = C.score(catalog, C.Workload(domain="chat"))
    assert (
        chat_table[chat_table.hub_id == "HuggingFaceH4/ultrachat_200k"].score.item()
        > table[table.hub_id == "HuggingFaceH4/ultrachat_200k"].score.item()
    )


def test_non_commercial_license_is_penalised_only_for_commercial_use():
    entry = {
        "hub_id": "x/y",
        "license": "cc-by-nc-4.0",
        "rows": 50000,
        "schema": "alpaca",
        "turns": "single",
        "category": "Alpaca-style",
    }
    commercial, reasons = C.score_entry(entry, C.Workload(commercial=True))
    research, _ = C.score_entry(entry, C.Workload(commercial=False))
    assert research - commercial == 5 and any("non-commercial" in r for r in reasons)


def test_plot_scores(catalog):
    fig = C.plot_scores(C.score(catalog))
    assert len(fig.axes[0].patches) >= len(catalog)


def test_discover_cli_offline(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    discover_cli.add_discover_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["discover", "--offline", "--domain", "agentic"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "catalog snapshot" in out.splitlines()[0] and "nebius/SWE-agent-trajectories" in out


def test_discover_is_a_draftlab_command():
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "draftlab.cli", "discover", "--offline", "--domain", "code"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "catalog snapshot" in run.stdout.splitlines()[0] and "nvidia/OpenCodeInstruct" in run.stdout
