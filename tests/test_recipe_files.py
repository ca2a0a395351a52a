"""recipes/*.yaml: each loads as training settings and opens with its evidence, whose cited records exist;
eagle3-best.yaml is TrainConfig's defaults (the one recipe `draftlab train` uses unless told otherwise)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from draftlab.train_draft import TrainConfig
from draftlab.train_draft.recipe import load_recipe

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_the_recipes_are_there():
    assert {p.stem for p in RECIPES} >= {"eagle3-best", "eagle3-reference"}


def test_the_best_recipe_is_trainconfigs_defaults():
    best = load_recipe(ROOT / "recipes" / "eagle3-best.yaml")
    defaults = dataclasses.asdict(TrainConfig())
    assert {k: defaults[k] for k in best} == best
    assert (best["fc_norm"], best["lr"], best["epochs"]) == ("per_layer", 1e-3, 5.0)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_opens_with_its_evidence(path):
    text = path.read_text()
    head = text.split("\n\n")[0] if not text.startswith("#") else text[: text.index("\narch:")]
    assert all(line.startswith("#") for line in head.splitlines()), "the evidence is the opening comment block"
    for word in ("data:", "epochs:", "hardware:", "SGLang", "records:"):
        assert word in head, f"{path.name}: no {word!r} in its evidence"
    cited = re.findall(r"(results/[\w./-]+\.\w+)", head)
    assert cited and all((ROOT / c.rstrip(".,")).is_file() for c in cited), cited
    settings = load_recipe(path)
    cfg = TrainConfig(**settings, target="tiny")
    assert cfg.arch == settings["arch"]


def test_train_help_says_target_is_required_and_defaults_are_the_recipe(capsys):
    from draftlab.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "recipes/eagle3-best.yaml" in text and "--target has no default" in text and "--config FILE" in text
